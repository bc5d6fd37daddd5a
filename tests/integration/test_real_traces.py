"""Invariants over every real trace we have: bundled samples always, ../shared when present."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from kinetoscope.analyze.ingest.loader import find_jobs, load_job
from kinetoscope.analyze.report.builder import build_report
from kinetoscope.errors import KinetoscopeError

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "traces"


def _real_paths() -> list[Path]:
    paths = sorted((ROOT / "sample_traces" / "real").glob("*.json*"))
    paths += [ROOT / "sample_traces" / "real" / "hta_2rank"]
    paths += sorted(p for p in (ROOT / "sample_traces" / "cpu").iterdir() if p.is_dir())
    if SHARED.is_dir():
        paths += sorted(SHARED.rglob("*.json*"))
        paths += [SHARED / "HolisticTraceAnalysis" / "tests" / "data" / "trace_filter"]
    return paths


def _fractions(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if (str(k).endswith("fraction") or str(k).endswith("_share")) and isinstance(v, (int, float)):
                yield f"{path}.{k}", v
            yield from _fractions(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _fractions(v, f"{path}[{i}]")


@pytest.fixture(scope="module", params=_real_paths(), ids=lambda p: p.name)
def report(request):
    (job,) = find_jobs(request.param)
    try:
        return build_report(load_job(job))
    except KinetoscopeError as exc:  # pragma: no cover - every shared trace is analysable today
        pytest.fail(f"{request.param}: {exc}")


def test_no_analyzer_fails(report):
    assert report.failures == ()


def test_fractions_are_in_unit_interval(report):
    """Fractions are never clamped: one outside [0, 1] is a bug the report lists, and there must be none."""
    assert report.violations == ()
    for where, value in _fractions(report.to_dict()):
        assert 0.0 <= value <= 1.0, where


def test_busy_plus_idle_is_the_window_per_stream_and_device(report):
    for r in report.ranks:
        gpu = r["gpu"]
        if not gpu:
            continue
        window = r["window_us"]
        for s in gpu["streams"]:
            assert math.isclose(s["busy_us"] + s["idle_us"], window, abs_tol=1e-3)
        for d in gpu["devices"]:
            if d["idle_us"] is None:  # the trace misses the GPU's activity: idle is not judged at all
                assert d["idle_fraction"] is None and gpu["missing_activity"]["unknown_us"] > 0
                continue
            assert math.isclose(d["busy_us"] + d["idle_us"], window, abs_tol=1e-3)
            assert math.isclose(sum(d["idle_by_cause_us"].values()), d["idle_us"], abs_tol=2e-3)
            # the device is busy at least as long as its busiest stream, at most their sum
            streams = [s for s in gpu["streams"] if s["device"] == d["device"]]
            assert d["busy_us"] + 1e-3 >= max(s["busy_us"] for s in streams)
            assert d["busy_us"] <= sum(s["busy_us"] for s in streams) + 1e-3


def test_loader_time_within_window_and_findings_well_formed(report):
    for r in report.ranks:
        loader = r["loader"]
        assert loader["time_us"] <= r["window_us"] + 1e-3
        if loader["gpu_idle_cost_us"] is not None:
            assert loader["gpu_idle_cost_us"] <= loader["time_us"] + 1e-3
    for f in report.findings:
        assert f.severity in ("critical", "warning", "info") and f.title and f.recommendation


def _hta_paths() -> list[Path]:
    paths = [ROOT / "sample_traces" / "real" / "v100_resnet50_2021.json.gz"]
    if SHARED.is_dir():
        paths = sorted(p for p in SHARED.rglob("*.json*") if "trace_filter" not in str(p))
        paths += [SHARED / "HolisticTraceAnalysis" / "tests" / "data" / "trace_filter"]
    return paths


@pytest.mark.slow
@pytest.mark.parametrize("path", _hta_paths(), ids=lambda p: p.name)
def test_production_gpu_analyzer_agrees_with_hta_on_htas_terms(path):
    """Our own ``gpu`` analyzer, run on each rank as HTA sees it (its event selection, rounding and window),
    gives HTA's busy time exactly, once two differences of definition are accounted for exactly: HTA counts
    non-work events that carry a stream argument as busy (their union less the work's is added), and its
    rounding makes sub-microsecond events negative (that loss is subtracted). docs/hta.md has the table."""
    pytest.importorskip("hta")
    from kinetoscope.analyze.analyzers.gpu import analyze_gpu
    from kinetoscope.analyze.crosscheck.hta import (
        HtaUnavailable,
        hta_extra_busy_events,
        hta_extra_busy_us,
        hta_rounding_loss_us,
        hta_temporal_breakdown,
        hta_view,
    )
    from kinetoscope.analyze.model.config import DEFAULT_CONFIG

    (job,) = find_jobs(path)
    try:
        hta = hta_temporal_breakdown(list(job.files))
    except HtaUnavailable:
        pytest.skip("HTA fails on this trace (docs/hta.md lists why)")
    trace = load_job(job)
    for r in trace.ranks:
        file = next(f for f in job.files if f.name in r.meta.source)
        gpu = analyze_gpu(hta_view(r), DEFAULT_CONFIG).fragment()["gpu"]
        ours = sum(d["busy_us"] for d in gpu["devices"]) - hta_rounding_loss_us(r)
        h = hta[r.rank]
        theirs = h.window_us - h.idle_us
        if hta_extra_busy_events(file):
            extra = hta_extra_busy_us(file, r)
            assert extra is not None, "a trace with two steps or more and stream-argument events: add its case"
            ours += extra
        assert abs(theirs - ours) < 0.5, (r.rank, theirs, ours)


def _reference_paths() -> list[Path]:
    paths = sorted((ROOT / "sample_traces" / "real").glob("*.json*"))
    paths += sorted((ROOT / "sample_traces" / "real" / "hta_2rank").glob("*.json*"))
    if SHARED.is_dir():  # the smaller shared traces too (the reference parser is slow on purpose)
        paths += sorted(p for p in SHARED.rglob("*.json*") if p.stat().st_size < 1_200_000)
    return paths


@pytest.mark.slow
@pytest.mark.parametrize("path", _reference_paths(), ids=lambda p: p.name)
def test_fast_loader_matches_the_plain_json_reference(path):
    from reference_loader import reference_events

    from kinetoscope.analyze.ingest.loader import load_trace

    ev = load_trace(path).ranks[0].events

    def none(v):
        return None if v is pd.NA or v != v else int(v)

    fast = sorted(
        ((int(r.ts_ns), int(r.dur_ns), str(r.name), str(r.cat), none(r.device), none(r.stream), none(r.correlation))
         for r in ev.itertuples()),
        key=lambda r: (r[0], r[1], r[2], r[3]),
    )
    assert fast == reference_events(path)
