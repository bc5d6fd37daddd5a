"""Hang dumps built in code (known answers), their reading, the ``hang`` finding, and the capture's watchdog in this
process. The real hangs, under torchrun, are in ``test_hangs_real.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hangbuilder import LIB, USER, dump, entry, history, write_dumps

from kinetoscope.analyze.analyzers.hang import diagnose, divergences
from kinetoscope.analyze.ingest.jobs import find_jobs
from kinetoscope.analyze.ingest.loader import load_job
from kinetoscope.analyze.report.builder import build_report
from kinetoscope.errors import TraceSourceError
from kinetoscope.hangdump import Frame, RaisedException


def test_a_rank_entering_another_op_is_mismatched_against_the_majority():
    dumps = tuple(dump(r, history(6, op="barrier", sizes=()) if r == 2 else history(6, op="all_reduce"))
                  for r in range(4))
    metrics, f = diagnose(dumps)
    ev = f.evidence
    assert (ev["process_group"], ev["seq"], ev["expected_op"], ev["expected_is_a_tie"]) == (
        "0", 7, "all_reduce[[4, 3]]", False)
    assert (ev["missing_ranks"], ev["mismatched_ranks"], ev["waiting_ranks"], ev["stuck_ranks"]) == (
        [], [2], [0, 1, 3], [2])
    assert ev["stuck"][0]["where"] == {"file": USER, "line": 42, "function": "step", "code": None}
    assert f.severity == "critical" and f.rank is None
    per = {e["rank"]: e for e in ev["per_rank"]}
    assert per[2]["at_seq"]["op"] == "barrier" and per[2]["last_completed"]["seq"] == 6
    assert per[0]["last_entered"] == {"seq": 7, "op": "all_reduce", "input_sizes": [[4, 3]], "input_dtypes": ["Float"],
                                      "output_sizes": [[4, 3]], "output_dtypes": ["Float"], "state": "scheduled",
                                      "completed": False}
    assert metrics.stuck_ranks == [2] and metrics.seq == 7


def test_a_rank_that_never_entered_is_missing_and_its_stack_says_where():
    frames = [Frame(file=LIB, line=320, function="wait"), Frame(file=USER, line=12, function="__getitem__"),
              Frame(file="/x/site-packages/torch/utils/data/dataloader.py", line=700, function="__next__")]
    dumps = tuple(dump(r, history(3) if r == 1 else history(3, op="all_reduce"), frames=frames if r == 1 else None)
                  for r in range(4))
    ev = diagnose(dumps)[1].evidence
    assert (ev["seq"], ev["missing_ranks"], ev["mismatched_ranks"], ev["waiting_ranks"]) == (4, [1], [], [0, 2, 3])
    assert ev["stuck"][0]["where"]["function"] == "__getitem__" and ev["stuck"][0]["why"] == "never entered it"
    assert [fr["function"] for fr in ev["stuck"][0]["frames"]] == ["wait", "__getitem__", "__next__"]


def test_sizes_and_dtypes_count_as_a_mismatch():
    sizes = tuple(dump(r, history(2, sizes=((5,),) if r == 3 else ((4, 3),))) for r in range(4))
    assert diagnose(sizes)[1].evidence["mismatched_ranks"] == [3]
    dtypes = tuple(dump(r, history(2, dtype="Half" if r == 0 else "Float")) for r in range(4))
    ev = diagnose(dtypes)[1].evidence
    assert ev["mismatched_ranks"] == [0] and ev["expected_op"] == "all_reduce[[4, 3]]"


def test_two_ranks_that_differ_tie_and_the_lower_ranks_op_is_expected():
    dumps = (dump(0, history(4, op="all_reduce"), world=2), dump(1, history(4, op="barrier", sizes=()), world=2))
    ev = diagnose(dumps)[1].evidence
    assert ev["expected_is_a_tie"] is True and ev["mismatched_ranks"] == [1] and ev["waiting_ranks"] == [0]


def test_a_ring_buffer_that_wrapped_starts_where_every_rank_still_has_entries():
    # rank 0 kept #5-#9, rank 1 #3-#9: #1-#4 are not compared (rank 0 lost them), #9 is where they part
    r0 = [entry(s) for s in range(5, 9)] + [entry(9, done=False)]
    r1 = [entry(s, op="broadcast" if s == 3 else "all_reduce") for s in range(3, 9)]
    r1 += [entry(9, op="barrier", sizes=(), done=False)]
    found = divergences((dump(0, r0, world=2), dump(1, r1, world=2)))
    assert [(d.group, d.seq, d.mismatched) for d in found] == [("0", 9, (1,))]


def test_a_rank_without_a_dump_is_unknown_never_missing():
    dumps = tuple(dump(r, history(5) if r == 1 else history(5, op="all_reduce")) for r in (0, 1, 3))
    ev = diagnose(dumps)[1].evidence
    assert ev["ranks_without_dump"] == [2] and ev["unknown_ranks"] == [2]
    assert ev["missing_ranks"] == [1] and ev["stuck_ranks"] == [1]


def test_a_subgroup_takes_its_members_from_the_recorders_config():
    group = ("5", "tp")
    config = {"5": {"name": "5", "desc": "tp", "ranks": "[2, 3]"}}
    dumps = (dump(0, history(2)), dump(1, history(2)),
             dump(2, history(2) + [entry(1, group=group, done=False)], pg_config=config),
             dump(3, history(2), pg_config=config))
    found = divergences(dumps)
    assert [(d.group, d.seq, d.members, d.missing, d.waiting) for d in found] == [("5", 1, (2, 3), (3,), (2,))]


def test_a_raised_exception_is_the_stuck_ranks_frame():
    exc = RaisedException(type="ValueError", message="bad batch",
                          frames=[Frame(file=USER, line=77, function="train_step",
                                        code="raise ValueError('bad batch')")])
    dumps = tuple(dump(r, history(3) if r == 0 else history(3, op="all_reduce"),
                       reason="exception" if r == 0 else "SIGTERM", exc=exc if r == 0 else None, world=3)
                  for r in range(3))
    f = diagnose(dumps)[1]
    ev = f.evidence
    assert ev["stuck_ranks"] == [0] and ev["raised_ranks"] == [0]
    assert ev["stuck"][0]["exception"] == {"type": "ValueError", "message": "bad batch"}
    assert ev["stuck"][0]["where"]["line"] == 77
    assert "raised ValueError in train_step (train.py:77)" in f.title


def test_dumps_of_a_job_in_step_give_no_finding():
    dumps = tuple(dump(r, history(6), reason="SIGUSR1") for r in range(4))
    metrics, f = diagnose(dumps)
    assert f is None and metrics.dumps == 4 and metrics.reasons == {str(r): "SIGUSR1" for r in range(4)}


def test_analyze_a_directory_of_dumps_alone(tmp_path):
    out = write_dumps(tmp_path / "job", [dump(r, history(3) if r == 1 else history(3, op="all_reduce"))
                                         for r in range(4)])
    jobs = find_jobs(out)
    assert [(len(j.files), len(j.hang_dumps)) for j in jobs] == [(0, 4)]
    report = build_report(load_job(jobs[0]))
    assert [f.id for f in report.findings] == ["hang"]
    assert report.job["hang"]["missing_ranks"] == [1] and report.ranks == ()
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "analyze", "--format", "json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["findings"][0]["id"] == "hang" and doc["findings"][0]["nature"] == "correctness"
    assert doc["findings"][0]["evidence"]["stuck_ranks"] == [1]
    text = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "analyze", str(out)],
                          capture_output=True, text=True, timeout=300).stdout
    assert ("  [CRITICAL] job: Hang at collective #4 (all_reduce[[4, 3]]) of process group 0: rank 1 never entered "
            "it") in text
    assert "Hang: process group 0, collective #4 (expected all_reduce[[4, 3]])" in text
    assert "  missing    ranks 1\n  waiting    ranks 0, 2, 3\n" in text
    assert ("  rank 1: entered #3 all_reduce[[4, 3]] completed; last completed #3 all_reduce[[4, 3]] completed; "
            "in step (train.py:41) (watchdog, 7 steps)") in text


def test_a_pickled_dump_is_refused_in_one_line(tmp_path):
    out = write_dumps(tmp_path / "job", [dump(0, history(2))])
    (out / "nccl_trace_rank_1").write_bytes(b"\x80\x04\x95" + b"\0" * 20)
    with pytest.raises(TraceSourceError, match="never unpickles"):
        find_jobs(out)
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "analyze", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "_dump_fr_trace_json" in proc.stderr
    (out / "nccl_trace_rank_1").unlink()
    (out / "rank-3.hang.json").write_bytes(b"\x80\x04\x95")
    with pytest.raises(TraceSourceError, match="never unpickles"):
        find_jobs(out)


def test_a_hang_dump_beside_traces_is_no_trace(tmp_path, builder):
    b = builder()
    b.step(0, 0, 1000)
    out = tmp_path / "job"
    b.write(out / "rank-0.pt.trace.json")
    write_dumps(out, [dump(0, history(2), world=1)])
    jobs = find_jobs(out)
    assert [(len(j.files), len(j.hang_dumps)) for j in jobs] == [(1, 1)]


# --- the capture's watchdog, in this process ---------------------------------------------------------------
def test_default_timeout_is_the_larger_of_the_floor_and_many_steps():
    from kinetoscope.capture.hangwatch import default_timeout_s

    assert default_timeout_s([]) == 300.0
    assert default_timeout_s([1_000_000_000] * 5) == 300.0
    assert default_timeout_s([10_000_000_000, 30_000_000_000, 20_000_000_000]) == 400.0


def _wait_for(path: Path, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return json.loads(path.read_text())


def test_the_watchdog_writes_a_dump_when_no_step_ends(tmp_path):
    from kinetoscope.capture.hangwatch import HangWatch

    walls = [2_000_000, 4_000_000, 3_000_000]
    long_ago = time.perf_counter_ns() - 60 * 10**9
    watch = HangWatch(tmp_path, lambda: (3, long_ago, walls), timeout_s=0.2)
    watch.start()
    try:
        doc = _wait_for(tmp_path / "rank-0.hang.json")
        deadline = time.monotonic() + 120
        while watch._stall_written != (3,):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # a SIGTERM or an error in the same stall finds the job coming apart: the stall's dump stays
        watch.dump("SIGTERM")
        assert json.loads((tmp_path / "rank-0.hang.json").read_text())["reason"] == "watchdog"
    finally:
        watch.stop()
    assert doc["reason"] == "watchdog" and doc["steps_ended"] == 3 and doc["timeout_s"] == 0.2
    assert doc["recent_step_wall_ns"] == walls and doc["median_step_ns"] == 3_000_000
    assert doc["seconds_since_progress"] >= 60
    training = [t for t in doc["threads"] if t["training"]]
    assert len(training) == 1 and training[0]["name"] == "MainThread"
    assert any(f["function"] == "_wait_for" for f in training[0]["frames"])
    assert doc["flight_recorder"] is None and doc["flight_recorder_note"]


def test_sigusr1_writes_a_dump_on_demand(tmp_path):
    from kinetoscope.capture.hangwatch import HangWatch

    watch = HangWatch(tmp_path, lambda: (5, time.perf_counter_ns(), [1]), timeout_s=0)
    watch.start()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        doc = _wait_for(tmp_path / "rank-0.hang.json")
    finally:
        watch.stop()
    assert doc["reason"] == "SIGUSR1" and doc["steps_ended"] == 5
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # put back
    assert signal.set_wakeup_fd(-1) == -1


def test_a_process_that_never_trained_writes_no_dump(tmp_path):
    from kinetoscope.capture.hangwatch import HangWatch

    watch = HangWatch(tmp_path, lambda: (None, None, []), timeout_s=0)
    assert watch.dump("SIGUSR1") is None and not list(tmp_path.iterdir())


def test_a_profiler_gone_at_the_runs_end_is_no_new_stall(tmp_path):
    """While the run finishes (capture's SIGTERM handler stops the profiler) the step clock is gone: the watchdog
    must not take that for a stall and replace the dump written at the hang."""
    dist = pytest.importorskip("torch.distributed")
    from kinetoscope.capture.hangwatch import HangWatch

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())  # a rank: it may write dumps
    try:
        long_ago = time.perf_counter_ns() - 60 * 10**9
        state = {"progress": (4, long_ago, [1_000_000])}
        watch = HangWatch(tmp_path, lambda: state["progress"], timeout_s=1.0)
        watch._started_ns = long_ago  # started long before: without steps, its own start is the clock
        watch._check_progress()
        assert json.loads((tmp_path / "rank-0.hang.json").read_text())["steps_ended"] == 4
        state["progress"] = (None, None, [])
        (tmp_path / "rank-0.hang.json").unlink()
        watch._check_progress()
        assert not (tmp_path / "rank-0.hang.json").exists()
        assert watch.dump("SIGUSR1") is not None  # a rank in a process group writes before its first step too
    finally:
        dist.destroy_process_group()


def test_batch_lands_a_hangs_table_and_one_bad_job_never_sinks_it(tmp_path):
    pytest.importorskip("dask.distributed")
    from kinetoscope.batch.discover import discover
    from kinetoscope.batch.run import run_batch
    from kinetoscope.batch.store import read_table

    roots = tmp_path / "jobs"
    write_dumps(roots / "a", [dump(r, history(3, op="barrier", sizes=()) if r == 3 else history(3, op="all_reduce"))
                         for r in range(4)])
    write_dumps(roots / "b", [dump(r, history(5), reason="SIGUSR1") for r in range(4)])  # in step: no hang
    bad = write_dumps(roots / "c", [dump(0, history(2))])
    (bad / "rank-1.hang.json").write_bytes(b"\x80\x04\x95")
    assert [(Path(j.name).name, len(j.files), len(j.hang_dumps)) for j in discover([roots])] == \
        [("a", 0, 4), ("b", 0, 4), ("c", 0, 2)]
    # jobs of hang dumps alone submit no task: an in-process cluster (no worker process to start; was ~5 s of the
    # fast subset) serves; the process-based one is test_batch's (marked cluster)
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        run_batch([roots], tmp_path / "store", client=client)
    hangs = read_table(tmp_path / "store", "hangs").sort_values("job")
    assert [Path(j).name for j in hangs["job"]] == ["a", "b", "c"]
    assert list(hangs["status"]) == ["ok", "ok", "failed"]
    assert "never unpickles" in hangs["error"].iloc[2]
    a = hangs.iloc[0]
    assert (a["hung"], a["process_group"], a["seq"], a["op"]) == (True, "0", 4, "all_reduce[[4, 3]]")
    assert (list(a["stuck_ranks"]), list(a["mismatched_ranks"]), list(a["waiting_ranks"])) == ([3], [3], [0, 1, 2])
    assert hangs.iloc[1]["hung"] == False  # noqa: E712 - a numpy bool
    findings = read_table(tmp_path / "store", "findings")
    assert list(findings["id"]) == ["hang"] and Path(findings["job"].iloc[0]).name == "a"


def test_before_the_first_step_start_up_is_never_a_stall_before_the_floor(tmp_path, monkeypatch):
    """A loaded host can take longer than a short --hang-timeout to import and set up: a dump then would stand for
    the hang later. Before the first step ends the timeout is at least HANG_FLOOR_S."""
    from kinetoscope.capture import hangwatch

    monkeypatch.setattr(hangwatch, "_in_process_group", lambda: True)  # a rank, before its first step
    watch = hangwatch.HangWatch(tmp_path, lambda: (None, None, []), timeout_s=1.0)
    watch._started_ns = time.perf_counter_ns() - int((hangwatch.HANG_FLOOR_S - 10) * 1e9)
    watch._check_progress()
    assert not (tmp_path / "rank-0.hang.json").exists()
    watch._started_ns = time.perf_counter_ns() - int((hangwatch.HANG_FLOOR_S + 10) * 1e9)
    watch._check_progress()
    assert json.loads((tmp_path / "rank-0.hang.json").read_text())["steps_ended"] is None


def test_sigterm_is_left_alone_once_the_program_has_its_own_handler(tmp_path, monkeypatch):
    """torchrun's launcher imports torch (capture installs, SIGTERM has its default action: capture's handler goes in),
    then puts its own handler in: its SIGTERM is then its own, and the watchdog must neither dump nor end it."""
    from kinetoscope.capture import hangwatch

    ended = []
    monkeypatch.setattr(hangwatch, "_end_as_sigterm", lambda: ended.append(True))
    monkeypatch.setattr(hangwatch, "SIGTERM_GRACE_S", 0.05)
    monkeypatch.setattr(hangwatch, "_in_process_group", lambda: True)
    watch = hangwatch.HangWatch(tmp_path, lambda: (2, time.perf_counter_ns(), []), timeout_s=0,
                                terminating=lambda: False)
    watch.own_sigterm(lambda signum, frame: None)  # capture's, replaced since: SIGTERM here is SIG_DFL
    watch._on_signal(signal.SIGTERM)
    assert ended == [] and not (tmp_path / "rank-0.hang.json").exists()
    mine = signal.getsignal(signal.SIGTERM)
    watch.own_sigterm(mine)  # still the process's handler: dump, then end as SIGTERM would have
    watch._on_signal(signal.SIGTERM)
    assert ended == [True] and json.loads((tmp_path / "rank-0.hang.json").read_text())["reason"] == "SIGTERM"


def test_an_exceptions_dump_is_not_replaced_by_the_teardowns_sigterm(tmp_path, monkeypatch):
    """The training thread raised (its dump says why); torchrun's SIGTERM then arrives while capture finishes the run
    (no step clock any more): that dump would show nothing of the cause."""
    from kinetoscope.capture import hangwatch

    monkeypatch.setattr(hangwatch, "_in_process_group", lambda: True)
    state = {"progress": (4, time.perf_counter_ns(), [1])}
    watch = hangwatch.HangWatch(tmp_path, lambda: state["progress"], timeout_s=0)
    try:
        raise ValueError("bad batch")
    except ValueError as exc:
        watch.dump("exception", exc=exc)
    state["progress"] = (None, None, [])
    watch.dump("SIGTERM")
    doc = json.loads((tmp_path / "rank-0.hang.json").read_text())
    assert doc["reason"] == "exception" and doc["exception"]["type"] == "ValueError" and doc["steps_ended"] == 4
    watch.dump("SIGUSR1")  # asked for by hand: always written
    assert json.loads((tmp_path / "rank-0.hang.json").read_text())["reason"] == "SIGUSR1"


def test_where_the_only_other_rank_left_no_dump_the_rank_that_raised_is_named():
    """2 ranks, sizes differ: gloo aborts rank 0 (no dump); rank 1's all_reduce #3 of [5] raises."""
    exc = RaisedException(type="RuntimeError", message="Connection reset by peer",
                          frames=[Frame(file=USER, line=34, function="<module>")])
    f = diagnose((dump(1, history(2, sizes=((5,),)), world=2, reason="exception", exc=exc),))[1]
    ev = f.evidence
    assert (ev["seq"], ev["unknown_ranks"], ev["ranks_without_dump"], ev["waiting_ranks"]) == (3, [0], [0], [1])
    assert ev["stuck_ranks"] == [1] and ev["stuck"][0]["why"] == "raised"
    assert "rank 0 left no record of it" in f.title and f.recommendation.startswith("the ranks without a dump")


def test_where_the_only_other_rank_left_no_dump_and_none_raised_no_rank_is_named_stuck():
    """The same job where the launcher's SIGTERM reaches rank 1 before its all_reduce raises: rank 1 waits in #3
    and nothing says who parted (rank 0 left no record), so no rank is named stuck and rank 0 is named unknown."""
    f = diagnose((dump(1, history(2, sizes=((5,),)), world=2, reason="SIGTERM"),))[1]
    ev = f.evidence
    assert (ev["seq"], ev["unknown_ranks"], ev["waiting_ranks"], ev["raised_ranks"]) == (3, [0], [1], [])
    assert ev["stuck_ranks"] == [] and ev["stuck"] == []
    assert f.title == ("Hang at collective #3 (all_reduce[[5]]) of process group 0: rank 0 left no record of it "
                       "(no dump: ended without one, e.g. aborted)")


@pytest.mark.torch
@pytest.mark.slow
def test_profile_loop_left_by_an_exception_still_writes_the_ranks_dump(tmp_path):
    """The loop's body raises outside profile_loop's generator, and the unwinding closes the generator (stopping the
    profiler) before the exception reaches sys.excepthook: the hook stays for a loop left early. A loop that ran to
    its end leaves sys.excepthook as it found it."""
    script = tmp_path / "loop.py"
    script.write_text(
        "import sys\n"
        "from kinetoscope.capture import profile_loop\n"
        "before = sys.excepthook\n"
        f"for i in profile_loop(range(2), {str(tmp_path / 'whole')!r}, hang_timeout_s=0, telemetry=False):\n"
        "    pass\n"
        "assert sys.excepthook is before, 'a loop run to its end leaves the hook'\n"
        f"for i in profile_loop(range(9), {str(tmp_path / 'left')!r}, hang_timeout_s=0, telemetry=False):\n"
        "    if i == 3:\n"
        "        raise ValueError('bad batch')  # MARK\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "ValueError: bad batch" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "whole" / "rank-0.hang.json").exists()
    doc = json.loads((tmp_path / "left" / "rank-0.hang.json").read_text())
    assert doc["reason"] == "exception" and doc["steps_ended"] == 3
    assert doc["exception"]["type"] == "ValueError" and doc["exception"]["message"] == "bad batch"
    assert (doc["exception"]["frames"][0]["function"], doc["exception"]["frames"][0]["line"]) == ("<module>", 9)


def test_sigterm_while_the_rank_writes_why_it_left_ends_after_the_dump(tmp_path):
    """The launcher stops the job (SIGTERM) while the rank that raised writes its dump, in the main thread: the
    handler interrupts that dump. Before, the handler and the watchdog both waited on the dump's lock, held by the
    interrupted main thread: the rank hung with no dump until the launcher killed it (a CI run lost rank 1's dump
    so). Now the SIGTERM waits for the dump, then ends the process as the signal would have."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "from kinetoscope.capture import hangwatch\n"
        "hangwatch._in_process_group = lambda: True\n"
        f"watch = hangwatch.HangWatch({str(tmp_path / 'out')!r}, lambda: (4, time.perf_counter_ns(), [1]),"
        " timeout_s=0)\n"
        "watch.start()\n"
        "watch.take_sigterm()\n"
        "build = watch._build\n"
        "def build_then_stopped(*args, **kwargs):\n"
        "    doc = build(*args, **kwargs)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)  # the launcher stops the job here\n"
        "    for _ in range(50):\n"
        "        time.sleep(0.01)  # bytecode runs: the handler runs in the middle of the dump\n"
        "    return doc\n"
        "watch._build = build_then_stopped\n"
        "try:\n"
        "    raise ValueError('bad batch')\n"
        "except ValueError as exc:\n"
        "    watch.dump('exception', exc=exc)\n"
        "print('ran on after SIGTERM', flush=True)\n"
        "time.sleep(60)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr[-2000:])
    assert "ran on" not in proc.stdout
    doc = json.loads((tmp_path / "out" / "rank-0.hang.json").read_text())
    assert doc["reason"] == "exception" and doc["exception"]["message"] == "bad batch"


@pytest.mark.torch
@pytest.mark.slow
def test_under_capture_a_sigterm_during_the_ranks_exception_waits_for_its_dump_and_traceback(tmp_path):
    """The same race under ``kinetoscope capture`` (capture's own SIGTERM handler, the excepthook of auto-capture):
    the SIGTERM sent while the rank writes why it left is held back until the dump is on disk and the traceback is
    printed, then ends the process as SIGTERM would (capture passes on 143); the run's end names the crash, not the
    SIGTERM (was: "SIGTERM", and no traceback)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import os, signal, time, torch\n"
        "from kinetoscope.capture import auto\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(6):\n"
        "    model(torch.randn(8, 4)).pow(2).mean().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
        "    if i == 3:\n"
        "        watch = auto._state['watch']\n"
        "        build = watch._build\n"
        "        def build_then_stopped(*args, **kwargs):\n"
        "            doc = build(*args, **kwargs)\n"
        "            os.kill(os.getpid(), signal.SIGTERM)  # the launcher stops the job here\n"
        "            for _ in range(50):\n"
        "                time.sleep(0.01)\n"
        "            return doc\n"
        "        watch._build = build_then_stopped\n"
        "        raise ValueError('bad batch')\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "capture", "--out", str(out), "--wait", "0",
                           "--warmup", "1", "--active", "2", "--", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert "ValueError: bad batch" in proc.stderr  # the traceback, printed before the process ended
    doc = json.loads((out / "rank-0.hang.json").read_text())
    assert doc["reason"] == "exception" and doc["exception"]["message"] == "bad batch"
    manifest = json.loads((out / "rank-0.manifest.json").read_text())
    assert manifest["ended_by"] == "ValueError"
