"""Golden files for the real CUDA captures in sample_traces/gpu/ (recorded by scripts/record_gpu_traces.py on a
machine with an NVIDIA GPU and torch built with CUDA; analysing them needs no GPU).

None has been recorded yet, so the test skips and says why: whether this machine has a CUDA device to record
them on, and the command that records them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.report.builder import build_report
from kinetoscope.render.json import report_to_json

GPU = Path(__file__).resolve().parents[2] / "sample_traces" / "gpu"
#: each run's capture folder, with its golden report beside it as <run>.expected.json (inside, the loader would
#: take it for a second capture window)
RUNS = sorted(p for p in GPU.glob("*") if p.is_dir() and p.with_suffix(".expected.json").is_file())

pytestmark = pytest.mark.gpu


def cuda_device() -> str | None:
    """The name of the first NVIDIA device NVML sees, or None where there is no driver or no device."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver: no device
        return None
    try:
        if not pynvml.nvmlDeviceGetCount():
            return None
        return str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)))
    finally:
        pynvml.nvmlShutdown()


def nothing_recorded() -> str:
    device = cuda_device()
    here = f"this machine has {device} to record them" if device else "no CUDA device on this machine to record them"
    return (f"no CUDA captures in sample_traces/gpu/ yet, and {here}: `python scripts/record_gpu_traces.py` "
            "records them on an NVIDIA GPU with torch built with CUDA")


@pytest.mark.parametrize("run", RUNS or [None], ids=lambda p: p.name if p else "none-recorded")
def test_report_matches_golden(run):
    if run is None:
        pytest.skip(nothing_recorded())
    expected = json.loads(run.with_suffix(".expected.json").read_text())
    actual = json.loads(report_to_json(build_report(load_trace(run))))
    assert [f["id"] for f in actual["findings"]] == [f["id"] for f in expected["findings"]]
    assert len(actual["ranks"]) == len(expected["ranks"])
    for got, want in zip(actual["ranks"], expected["ranks"], strict=True):
        for key in ("window_us", "steps", "loader", "gpu", "h2d", "d2h", "memory"):
            assert got[key] == want[key], key
