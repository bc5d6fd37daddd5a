"""Golden files for the real CUDA captures in sample_traces/gpu/ (recorded by scripts/record_gpu_traces.py).

Skipped until a session with a GPU has recorded them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinetoscope.analyze.loader import load_trace
from kinetoscope.analyze.report import build_report
from kinetoscope.render.json import report_to_json

GPU = Path(__file__).resolve().parents[2] / "sample_traces" / "gpu"
RUNS = sorted(p for p in GPU.iterdir() if (p / "expected.json").is_file()) if GPU.is_dir() else []


@pytest.mark.skipif(not RUNS, reason="no CUDA captures recorded yet (scripts/record_gpu_traces.py on a GPU machine)")
@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_report_matches_golden(run):
    expected = json.loads((run / "expected.json").read_text())
    actual = json.loads(report_to_json(build_report(load_trace(run))))
    assert [f["id"] for f in actual["findings"]] == [f["id"] for f in expected["findings"]]
    for got, want in zip(actual["ranks"], expected["ranks"]):
        for key in ("window_us", "steps", "loader", "gpu", "h2d", "d2h", "memory"):
            assert got[key] == want[key], key
