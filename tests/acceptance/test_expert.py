"""The report against an expert's reading of every real trace (tests/expert/*.toml, written by studying
the raw traces, never the tool's output): no warning or critical finding an expert would not raise, none
stronger than the expert's, and recall kept where it is (docs/expert-readings.md has the table)."""

from __future__ import annotations

from pathlib import Path

import pytest
from expertlib import compare, read_expert

from kinetoscope.analyze.ingest.loader import find_jobs, load_job
from kinetoscope.analyze.report.builder import build_report

ROOT = Path(__file__).resolve().parents[2]
READINGS = sorted((ROOT / "tests" / "expert").glob("*.toml"))


def _report(reading):
    path = reading.path(ROOT)
    if path is None:
        pytest.skip(f"{reading.trace} is not here (../shared absent and no bundled copy)")
    (job,) = find_jobs(path)
    return build_report(load_job(job))


@pytest.fixture(scope="module", params=READINGS, ids=lambda p: p.stem)
def judged(request):
    reading = read_expert(request.param)
    report = _report(reading)
    return reading, report, compare(reading, report.findings)


def test_no_claim_an_expert_would_not_make(judged):
    reading, report, agreement = judged
    assert agreement.false_positives == [], [
        (f.id, f.rank, f.severity, f.title) for f in report.findings if (f.id, f.rank, f.severity) in
        {(i, r, s) for i, r, s in agreement.false_positives}]


def test_no_claim_stronger_than_the_experts(judged):
    assert judged[2].overclaimed == []


def test_what_the_expert_refuses_is_never_claimed(judged):
    reading, report, _ = judged
    claimed = {(f.id, f.rank or 0) for f in report.findings if f.severity in ("critical", "warning")}
    assert not (claimed & reading.refused)


def test_every_reading_is_well_formed():
    from kinetoscope.analyze.model.findings import FINDING_IDS

    assert len(READINGS) >= 32
    for path in READINGS:
        reading = read_expert(path)
        assert reading.doc.get("what") and reading.doc.get("method"), path.name
        for (fid, _), sev in reading.expected.items():
            assert fid in FINDING_IDS and sev in ("critical", "warning", "info"), (path.name, fid)
        for fid, _ in reading.refused:
            assert fid in FINDING_IDS, (path.name, fid)
        for f in reading.doc.get("finding", []) + reading.doc.get("not", []):
            assert f.get("why"), (path.name, f["id"])


@pytest.mark.slow
def test_recall_on_the_expert_claims_stays_where_it_is():
    """Every warning and critical finding the experts raise (over all readings present) is raised."""
    made = missed = 0
    misses = []
    for path in READINGS:
        reading = read_expert(path)
        if reading.path(ROOT) is None:
            continue
        agreement = compare(reading, _report(reading).findings)
        made += len(agreement.true_positives)
        missed += len(agreement.missed)
        misses += [(path.stem, *m) for m in agreement.missed]
    assert misses == []
    assert made > 0
