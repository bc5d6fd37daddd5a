"""Hostile and broken input through every entry point: the CLI, batch and the app.

Each file gets one clear line naming it and the problem (exit 2), or a report that says what was
skipped; never a traceback, never a hang (each CLI run is bounded by a timeout).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile import MAX_SIZE, Expect, write_corpus

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    return folder, write_corpus(folder)


def _cases():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return sorted(write_corpus(Path(tmp)))


@pytest.mark.slow
@pytest.mark.parametrize("name", _cases())
def test_cli(corpus, name):
    folder, expected = corpus
    expect: Expect = expected[name]
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "analyze", "--format", "json",
                           "--max-size", MAX_SIZE, str(folder / name)], capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - started
    assert "Traceback" not in proc.stderr
    assert elapsed < 30
    if expect.error:
        assert proc.returncode == 2, proc.stdout[:500]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and name in lines[0] and expect.error in lines[0], lines
    else:
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        warnings = " ".join(report["ranks"][0]["warnings"])
        if expect.note:
            assert expect.note in warnings


def test_partial_damage_is_reported_with_counts(corpus):
    from kinetoscope.analyze.ingest.loader import load_trace

    folder, _ = corpus
    rank = load_trace(folder / "wrong_types.json").ranks[0]
    warnings = " ".join(rank.meta.warnings)
    assert "3 items of traceEvents were not JSON objects" in warnings
    assert "1 complete events had no usable timestamp" in warnings
    assert "1 events had a negative duration" in warnings
    assert "strings" in set(rank.events["name"].astype(str))  # "200" read as 200 us


@pytest.mark.slow
@pytest.mark.cluster
def test_batch(corpus, tmp_path):
    pytest.importorskip("dask.distributed")
    from kinetoscope.analyze.ingest.limits import LoadLimits, parse_size
    from kinetoscope.batch import run_batch
    from kinetoscope.batch.store import read_table

    folder, expected = corpus
    summary = run_batch([folder], tmp_path / "store", workers=2,
                        limits=LoadLimits(max_decompressed_bytes=parse_size(MAX_SIZE)))
    traces = read_table(tmp_path / "store", "traces")
    by_name = {Path(p).name: row for p, row in zip(traces["path"], traces.to_dict("records"), strict=True)}
    assert set(by_name) == set(expected)
    for name, expect in expected.items():
        row = by_name[name]
        if expect.error:
            assert row["status"] == "failed" and expect.error in row["error"], (name, row["error"])
        else:
            assert row["status"] == "ok", (name, row["error"])
    assert summary.failed == sum(1 for e in expected.values() if e.error)


@pytest.mark.app
@pytest.mark.parametrize("name", _cases())
def test_app_upload(corpus, name, monkeypatch):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    folder, expected = corpus
    monkeypatch.setenv("KINETOSCOPE_MAX_SIZE", MAX_SIZE)
    at = AppTest.from_file(str(ROOT / "kinetoscope" / "app" / "main.py"), default_timeout=120)
    at.session_state["source"] = "Upload"
    at.session_state["pending_uploads"] = [(name, (folder / name).read_bytes())]
    at.run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    expect = expected[name]
    if expect.error:
        assert len(errors) == 1 and expect.error in errors[0] and "Traceback" not in errors[0], errors
    else:
        assert errors == [] and at.metric[0].label == "Mean step"
