"""The columnar cache: a reopened trace is the same trace, and damage is a miss, not an error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kinetoscope.analyze.ingest.cache import TABLES, key_for
from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.report.builder import build_report
from kinetoscope.render.json import report_to_json

ROOT = Path(__file__).resolve().parents[2]


def test_reopened_trace_has_identical_tables_and_report(tmp_path):
    # every table a real trace fills (events, memory, flows, instants, steps) at 2k events (the v100 resnet50
    # trace has the same tables at 45k: 4.2 s against 1.0 s at load 10)
    source = ROOT / "sample_traces" / "real" / "h100_bert-small.json.gz"
    cache = tmp_path / "cache"
    fresh = load_trace(source, cache=cache)
    assert len(list(cache.iterdir())) == 1
    assert all(len(getattr(fresh.ranks[0], name)) for name in ("events", "memory", "flows", "instants", "steps"))
    again = load_trace(source, cache=cache)
    for name in TABLES:
        a, b = getattr(fresh.ranks[0], name), getattr(again.ranks[0], name)
        if a is None:
            assert b is None
        else:
            pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_categorical=False)
    assert again.ranks[0].meta.thread_names == fresh.ranks[0].meta.thread_names
    a = json.loads(report_to_json(build_report(fresh)))
    b = json.loads(report_to_json(build_report(again)))
    assert a == b


def test_changed_file_misses_and_damaged_entry_is_ignored(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_bytes((ROOT / "sample_traces" / "real" / "h100_tiny_before_fix_trace.json").read_bytes())
    cache = tmp_path / "cache"
    load_trace(trace, cache=cache)
    entry = cache / key_for(trace, 0)
    (entry / "events.parquet").write_bytes(b"not parquet")
    assert len(load_trace(trace, cache=cache).ranks[0].events) == 9  # re-parsed
    trace.write_bytes(trace.read_bytes() + b"\n")
    assert key_for(trace, 0) != entry.name


def test_cli_cache_flag(tmp_path):
    env = {"KINETOSCOPE_CACHE_DIR": str(tmp_path / "c"), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "kinetoscope.cli", "analyze", "--format", "json",
           str(ROOT / "sample_traces" / "cpu" / "leak")]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env)
    second = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert first.returncode == second.returncode == 0
    assert json.loads(first.stdout)["findings"] == json.loads(second.stdout)["findings"]
    assert len(list((tmp_path / "c").iterdir())) == 1


@pytest.mark.slow
def test_parallel_rank_loading_gives_the_same_report():
    from kinetoscope.analyze.ingest.loader import find_jobs, load_job

    (job,) = find_jobs(ROOT / "sample_traces" / "real" / "hta_2rank")
    serial = json.loads(report_to_json(build_report(load_job(job))))
    parallel = json.loads(report_to_json(build_report(load_job(job, processes=2))))
    assert parallel == serial
