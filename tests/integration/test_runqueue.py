"""The capture's run-queue wait on a real run whose answer is known by construction (tests/scripts/runqueue_wait.py):
the training thread pinned to one CPU, alone or with a spinning process pinned beside it. Only what holds whatever
the machine's load is asserted: the per-step fields lie between the script's own reads of the same kernel counters
just inside and just outside each step; a step spinning W ms of CPU has at least W on a CPU; a thread cannot run and
wait at once; and with a competitor on its CPU, the thread (which never blocks in its body) waited at least as long
as the competitor ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "runqueue_wait.py"
STEPS, WORK_MS = 4, 30
#: CLOCK_MONOTONIC (the step's wall time) may be slewed against the scheduler's clock by NTP, 500 ppm at most
CLOCK_SLEW = 0.001

pytestmark = [pytest.mark.torch, pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(), reason="Linux only")]


def run(tmp_path: Path, mode: str) -> tuple[dict, dict, dict]:
    out = tmp_path / mode
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), mode, str(STEPS), str(WORK_MS)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return (json.loads((out / "probe.json").read_text()), json.loads((out / "rank-0.steps.json").read_text()),
            json.loads((out / "rank-0.manifest.json").read_text()))


def check_bounds(probe: dict, steps: dict) -> None:
    rows = probe["rows"]
    assert len(steps["runqueue_wait_ns"]) == len(rows) == STEPS
    assert all(r["threads"] == 1 for r in rows)  # no other Python thread: the body never waits for the GIL
    for k, r in enumerate(rows):
        outer_start = probe["before"] if k == 0 else [rows[k - 1]["s1"], rows[k - 1]["p1"]]
        outer_end = probe["after"] if k == STEPS - 1 else [rows[k + 1]["s0"], rows[k + 1]["p0"]]
        for i, field in ((0, "oncpu_ns"), (1, "runqueue_wait_ns")):
            inner = r["s1"][i] - r["s0"][i]
            outer = outer_end[0][i] - outer_start[0][i]
            assert inner <= steps[field][k] <= outer, (k, field)
        assert steps["oncpu_ns"][k] >= probe["work_ns"]
        wall = outer_end[1] - outer_start[1]
        assert steps["oncpu_ns"][k] + steps["runqueue_wait_ns"][k] <= wall * (1 + CLOCK_SLEW)


def test_a_thread_sharing_its_cpu_with_a_spinner_waits_as_long_as_the_spinner_runs(tmp_path):
    probe, steps, manifest = run(tmp_path, "competitor")
    check_bounds(probe, steps)
    assert manifest["host"]["thread_schedstat"] == "recorded"
    for k, r in enumerate(probe["rows"]):
        # one CPU: the competitor ran only while the (never blocking) training thread waited on the run queue
        spun = r["c1"] - r["c0"]
        assert steps["runqueue_wait_ns"][k] >= r["s1"][1] - r["s0"][1] >= spun > 0


def test_a_thread_alone_on_its_cpu_records_the_same_counters(tmp_path):
    probe, steps, manifest = run(tmp_path, "alone")
    check_bounds(probe, steps)
    assert len(steps["involuntary_switches"]) == STEPS and all(n >= 0 for n in steps["involuntary_switches"])
