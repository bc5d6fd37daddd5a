"""Issue 28, item 6: ``kinetoscope diff`` and its gate judge the time per step over the whole timed run. Capture-like
directories built in code (a trace window and ``rank-<r>.steps.json`` with step times known by construction), the
fallback to profiled steps, ranks, findings' measured cost, the gate's wording, and real captures of two small
training scripts (tests/scripts/bursty_loader.py, periodic_eval.py) run identically and with a planted slowdown."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tracebuilder import TraceBuilder

from kinetoscope import cli
from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.report.compare import run_step_change

ROOT = Path(__file__).resolve().parents[2]
PERIODIC_MS = [10.0] * 9 + [50.0]  # a validation pass every 10 steps: mean 14 ms, median 10 ms


def capture_dir(folder: Path, walls_ms: list[float], *, rank: int = 0, world: int = 1, first_ms: float = 400.0,
                loader_us: float = 0.0) -> Path:
    """A capture as ``kinetoscope capture`` writes it: one window (steps 2-4) and every step's wall time. The
    first step (``first_ms``: start-up) and steps 2-4 (profiled) are part of ``walls_ms``' run."""
    walls = [first_ms] + list(walls_ms)
    b = TraceBuilder(rank=rank if world > 1 else None, world_size=world if world > 1 else None)
    t = 0.0
    for n in (2, 3, 4):
        dur = walls[n] * 1000
        b.step(n, t, dur).op("aten::mm", t + loader_us, dur - loader_us)
        if loader_us:
            b.loader(t, loader_us)
        t += dur
    b.write(folder / f"rank-{rank}.step-2-4.pt.trace.json")
    (folder / f"rank-{rank}.steps.json").write_text(json.dumps({
        "rank": rank, "unit": "ns", "step_wall_ns": [int(w * 1e6) for w in walls], "data_wait_ns": [0] * len(walls),
        "profiled": [n in (2, 3, 4) for n in range(len(walls))]}))
    return folder


def diff(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "diff", *args], capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def test_the_step_change_is_the_mean_over_every_timed_step_but_the_first(tmp_path):
    """100 steps each; the validation pass grows 50 -> 66.8 ms: the mean 14 -> 15.68 ms, exactly +12%. The first
    step (start-up, 400 vs 900 ms) is left out, the profiled ones are in."""
    before = capture_dir(tmp_path / "before", PERIODIC_MS * 10)
    after = capture_dir(tmp_path / "after", ([10.0] * 9 + [66.8]) * 10, first_ms=900.0)
    c = run_step_change(load_trace(before), load_trace(after))
    assert c.change == pytest.approx(0.12, abs=1e-12) and c.verdict == "slower" and c.statistic == "mean"
    assert c.before.source == "capture" and not c.few_steps
    assert (c.before.stats.steps, c.before.stats.mean_us, c.before.stats.median_us) == (100, 14000.0, 10000.0)
    assert (c.before.first_step_us, c.after.first_step_us, c.before.profiled_steps) == (400000.0, 900000.0, 3)
    assert c.before.stats.period_steps == 10 and c.median_change == 0.0 and c.median_agrees is False


def test_the_json_shape_and_a_failed_gate(tmp_path):
    before = capture_dir(tmp_path / "before", PERIODIC_MS * 10)
    after = capture_dir(tmp_path / "after", ([10.0] * 9 + [66.8]) * 10)
    code, out, err = diff(str(before), str(after), "--max-regression", "5%", "--format", "json")
    doc = json.loads(out)
    assert code == 3 and err.startswith("kinetoscope: error: Gate --max-regression 5.0%: failed: the time per step "
                                        "grew +12.0% (95% CI +12.0% to +12.0%)")
    assert set(doc) == {"before", "after", "step_change", "step_change_statistic", "step_change_ci95",
                        "step_change_verdict", "step_times", "max_regression", "regressed", "gate", "metrics",
                        "metrics_rank", "findings", "kernels", "ops", "fixes"}
    assert doc["step_change"] == pytest.approx(0.12) and doc["step_change_statistic"] == "mean"
    assert doc["step_change_verdict"] == "slower" and doc["regressed"] is True
    assert doc["gate"] == {"max_regression": 0.05, "regressed": True, "basis": "interval"}
    times = doc["step_times"]
    assert set(times) == {"scope", "rank", "statistic", "change", "ci95", "df", "verdict", "median_change",
                          "median_agrees", "few_steps", "before", "after", "ranks"}
    assert set(times["before"]) == {"rank", "source", "steps", "total_us", "mean_us", "median_us", "period_steps",
                                    "batch_steps", "batches", "mean_se_us", "first_step_us", "profiled_steps"}
    assert times["before"]["total_us"] == pytest.approx(1_400_000.0)
    assert times["after"]["mean_us"] == pytest.approx(15680.0)
    assert [r["rank"] for r in times["ranks"]] == [0] and times["ranks"][0]["change"] == pytest.approx(0.12)


@pytest.mark.slow
def test_a_passing_gate_is_not_an_error(tmp_path):
    before = capture_dir(tmp_path / "before", PERIODIC_MS * 10)
    after = capture_dir(tmp_path / "after", ([10.0] * 9 + [66.8]) * 10)
    code, out, err = diff(str(before), str(after), "--max-regression", "15%")
    assert code == 0 and err == ""
    assert ("Gate --max-regression 15.0%: passed: +12.0% (95% CI +12.0% to +12.0%) is not above 15.0% with 95% "
            "confidence") in out
    assert "Time per step: slower: +12.0% (95% CI +12.0% to +12.0%), 14.00 ms -> 15.68 ms per step" in out
    assert "median step +0.0%: not used, it disagrees with the mean" in out
    assert ("before (rank 0): 100 steps timed by the capture after the first (400.00 ms, start-up, left out), 3 of "
            "them profiled; repeats every 10 steps; 10 batches of 10 steps") in out
    code, out, err = diff(str(before), str(after), "--max-regression", "15%", "--format", "json")
    assert code == 0 and err == "" and json.loads(out)["regressed"] is False


def test_identical_runs_read_as_no_change(tmp_path):
    rng = np.random.default_rng(0)
    walls = list(np.tile([2.0, 2.0, 2.0, 38.0], 25) + rng.uniform(-0.5, 0.5, 100))
    before, after = capture_dir(tmp_path / "a", walls), capture_dir(tmp_path / "b", walls, first_ms=350.0)
    code, out, err = diff(str(before), str(after), "--max-regression", "5%")
    assert code == 0 and err == "" and "Time per step: no change: +0.0% (95% CI" in out


def test_traces_without_step_times_fall_back_to_their_profiled_steps_on_both_sides(tmp_path):
    """Like for like: where one run has no steps.json, both are compared on their profiled steps (3 each)."""
    before = capture_dir(tmp_path / "before", [10.0] * 30)
    after = capture_dir(tmp_path / "after", [11.0] * 30)
    (after / "rank-0.steps.json").unlink()
    c = run_step_change(load_trace(before), load_trace(after))
    assert (c.before.source, c.after.source, c.few_steps) == ("profiled", "profiled", True)
    assert c.before.stats.steps == 3 and c.change == pytest.approx(0.1) and c.before.first_step_us is None
    code, out, _ = diff(str(before), str(after))
    assert "3 profiled steps (the trace's complete steps)" in out and "interval: from batch means, Student t" in out
    assert "over the profiled steps only (no steps.json), few steps, a wide interval" in out


def test_a_job_changes_as_its_slowest_rank(tmp_path):
    """Rank 1 is the slower in both runs (12 -> 13.2 ms, +10%); rank 0 speeds up (10 -> 9 ms, -10%). The job follows
    rank 1: the ranks wait for each other."""
    for name, r0, r1 in (("before", 10.0, 12.0), ("after", 9.0, 13.2)):
        capture_dir(tmp_path / name, [r0] * 40, rank=0, world=2)
        capture_dir(tmp_path / name, [r1] * 40, rank=1, world=2)
    c = run_step_change(load_trace(tmp_path / "before"), load_trace(tmp_path / "after"))
    assert (c.scope, c.before.rank, c.after.rank) == ("job", 1, 1) and c.change == pytest.approx(0.10)
    assert [(r.rank, round(r.change, 12), r.verdict) for r in c.ranks] == [(0, -0.1, "faster"), (1, 0.1, "slower")]
    _, out, _ = diff(str(tmp_path / "before"), str(tmp_path / "after"))
    assert ("the job's time per step is its slowest rank's, since ranks wait for each other: "
            "rank 1 before, rank 1 after") in out
    assert "    rank 0: faster: -10.0%" in out and "    rank 1: slower: +10.0%" in out
    assert "The profiled window of rank 1 (each run's report):" in out  # the job's slowest rank, not rank 0


@pytest.mark.slow
def test_findings_still_there_show_the_change_of_their_measured_cost(tmp_path):
    """A CPU run waiting 5 ms for data in each 10 ms step, then 3 ms: the loader stall is still there, and its cost
    fell from 5 to 3 ms per step (15 and 9 ms over the 3 profiled steps)."""
    before = capture_dir(tmp_path / "before", [10.0] * 20, loader_us=5000)
    after = capture_dir(tmp_path / "after", [10.0] * 20, loader_us=3000)
    code, out, _ = diff(str(before), str(after), "--format", "json")
    (row,) = [f for f in json.loads(out)["findings"] if f["id"] == "loader_stall"]
    assert row["status"] == "still there"
    assert (row["before_us_per_step"], row["after_us_per_step"], row["change_us_per_step"]) == (5000.0, 3000.0, -2000.0)
    _, text, _ = diff(str(before), str(after))
    assert "(loader_stall): 5.00 ms -> 3.00 ms per step (-2.00 ms)" in text


def test_a_trace_without_any_step_compares_windows(tmp_path):
    """No step in the after run: both runs are compared on their windows (never a mean step against a window)."""
    before = TraceBuilder()
    for n in range(3):
        before.step(n, n * 400, 400).op("aten::mm", n * 400, 300)
    before.write(tmp_path / "before.json")
    TraceBuilder().op("aten::mm", 0, 1500).write(tmp_path / "after.json")
    c = run_step_change(load_trace(tmp_path / "before.json"), load_trace(tmp_path / "after.json"))
    assert (c.statistic, c.before.source, c.after.source, c.verdict) == ("window", "window", "window", "unknown")
    assert c.change == pytest.approx(0.25) and c.ci_low is None  # 1200 -> 1500 us
    code, out, err = diff(str(tmp_path / "before.json"), str(tmp_path / "after.json"), "--max-regression", "10%")
    assert code == 3 and "Gate --max-regression 10.0%: failed: +25.0% (no interval), above 10.0%" in err
    assert ("Time per step: unknown: +25.0% (no steps: one window a run, no interval), 1.20 ms -> 1.50 ms (the "
            "windows' lengths)") in out


# --- real captures ----------------------------------------------------------------------------------------------
SCHEDULE = ["--skip-first", "1", "--wait", "0", "--warmup", "1", "--active", "3", "--no-telemetry"]


def _captures(tmp_path: Path, runs: dict[str, tuple[str, float]], seconds: float = 3.0) -> None:
    """Capture every run at once; each trains for ``seconds`` from the moment all are set up, so they cover the
    same stretch of time and the machine's load falls on all of them alike."""
    go = tmp_path / "go"
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "kinetoscope.cli", "capture", "--out", str(tmp_path / name), *SCHEDULE, "--",
         sys.executable, str(ROOT / "tests" / "scripts" / script), "100000", "--seconds", str(seconds),
         "--extra-ms", str(extra), "--ready", str(tmp_path / f"{name}.ready"), "--go", str(go)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for name, (script, extra) in runs.items()}
    deadline = time.monotonic() + 240
    while not all((tmp_path / f"{name}.ready").exists() for name in runs):
        failed = [n for n, p in procs.items() if p.poll() is not None]
        assert not failed and time.monotonic() < deadline, f"{failed} ended before training: " + "".join(
            procs[n].stderr.read() for n in failed)
        time.sleep(0.02)
    go.touch()
    for proc in procs.values():
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err


def _mean_step_ms(folder: Path) -> float:
    walls = json.loads((folder / "rank-0.steps.json").read_text())["step_wall_ns"][1:]
    return sum(walls) / len(walls) / 1e6


@pytest.mark.slow
@pytest.mark.torch
def test_real_captures_identical_runs_are_no_change_and_a_planted_slowdown_is_found(tmp_path, capsys):
    """Two scripts, each captured three times at once: twice identically, once with a slowdown planted.
    bursty_loader.py: two workers that cannot keep up (40 ms a batch: a slow step, a fast one, ~20 ms a step);
    planted: 40 ms more per batch, +20 ms a step. periodic_eval.py: 20 ms steps and a 60 ms validation every 10
    (~26 ms a step); planted: 26 ms more per step. The expected change is the planted time over the before run's
    mean step, read from its steps.json (not from the tool); the verdicts, not the timings, are asserted."""
    _captures(tmp_path, {"bursty-a": ("bursty_loader.py", 0), "bursty-b": ("bursty_loader.py", 0),
                         "bursty-c": ("bursty_loader.py", 40), "periodic-a": ("periodic_eval.py", 0),
                         "periodic-b": ("periodic_eval.py", 0), "periodic-c": ("periodic_eval.py", 26)})
    for shape, planted_ms in (("bursty", 20.0), ("periodic", 26.0)):
        a, b, c = (tmp_path / f"{shape}-{x}" for x in "abc")
        same = run_step_change(load_trace(a), load_trace(b))
        assert same.verdict == "no change" and same.before.source == "capture", (shape, same.change, same.ci_low)
        worse = run_step_change(load_trace(a), load_trace(c))
        expected = planted_ms / _mean_step_ms(a)
        assert worse.verdict == "slower" and worse.ci_low <= expected <= worse.ci_high, (
            shape, expected, worse.change, worse.ci_low, worse.ci_high)
    # the command line: the identical pair passes a 5% gate quietly, the planted bursty pair fails it
    capsys.readouterr()
    assert cli.main(["diff", str(tmp_path / "bursty-a"), str(tmp_path / "bursty-b"), "--max-regression", "5%"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "Gate --max-regression 5.0%: passed" in out
    assert cli.main(["diff", str(tmp_path / "bursty-a"), str(tmp_path / "bursty-c"), "--max-regression", "5%"]) == 3
    assert "Gate --max-regression 5.0%: failed" in capsys.readouterr().err
