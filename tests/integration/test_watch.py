"""The watch's policy on local folders, its tasks run in this process: settle time, once per file version,
retries with a limit, work in flight bounded. (Against S3, through the CLI and Dask: test_object_storage.py.)"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("pyarrow")
from tracebuilder import TraceBuilder  # noqa: E402

from kinetoscope.batch.store import open_store, read_table  # noqa: E402
from kinetoscope.batch.watch import Watcher, WatchPolicy  # noqa: E402


def one_rank(path: Path) -> None:
    b = TraceBuilder()
    for step in range(3):
        b.step(step, step * 1000, 1000).kernel(step * 1000 + 100, 500, name="gemm")
    b.write(path)


class Tasks:
    """``submit`` as a Dask client's, run here; files whose name contains ``dies`` lose their worker each time;
    with ``hold``, futures complete only when released."""

    def __init__(self, hold: bool = False) -> None:
        self.calls: list[str] = []
        self.hold = hold
        self.pending: list[tuple[Future, object, tuple]] = []
        self.most_in_flight = 0

    def submit(self, fn, *args):
        self.calls.append(args[0])
        fut: Future = Future()
        if self.hold:
            self.pending.append((fut, fn, args))
            self.most_in_flight = max(self.most_in_flight, sum(not f.done() for f, _, _ in self.pending))
        elif "dies" in args[0]:
            fut.set_exception(RuntimeError("worker died"))
        else:
            fut.set_result(fn(*args))
        return fut

    def release_one(self) -> bool:
        for fut, fn, args in self.pending:
            if not fut.done():
                fut.set_result(fn(*args))
                return True
        return False


def release_until_analysed(watcher: Watcher, tasks, n: int, timeout_s: float = 60.0):
    """Run ``watcher`` on a thread, releasing ``tasks`` one at a time until it has analysed ``n`` traces (or the
    time is up): (the stop event, the thread, the deadline), the watcher still running."""
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while watcher.summary.analysed < n and time.monotonic() < deadline:
        time.sleep(0.1)
        tasks.release_one()
    return stop, thread, deadline


def watch_until(watcher: Watcher, done, timeout_s: float = 60.0) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(timeout_s)
    assert not thread.is_alive()
    assert done(), watcher.summary


def test_settle_time_then_each_version_once(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    one_rank(src / "a.json")  # plain JSON: written again, the same bytes (a gzip header holds its time)
    root = open_store(tmp_path / "store", create=True)
    now = [0.0]
    tasks, events = Tasks(), []
    watcher = Watcher([str(src)], root, tasks.submit, clock=lambda: now[0],
                      policy=WatchPolicy(settle_s=60, poll_s=0.01, max_poll_s=0.01),
                      on_event=lambda kind, text: events.append(kind))
    watch_until(watcher, lambda: watcher.summary.listings >= 5)
    assert tasks.calls == [] and events == ["waiting"]  # unchanged for less than the settle time: not yet
    now[0] = 60.0
    watch_until(watcher, lambda: watcher.summary.analysed == 1 and watcher.summary.listings >= 10)
    assert tasks.calls == [str(src / "a.json")]  # listed again and again, analysed once
    one_rank(src / "a.json")  # a new version of the file (rewritten: a new mtime) ...
    watch_until(watcher, lambda: "waiting" in events[1:])
    now[0] = 200.0  # ... settles, and is analysed again: the store already holds its content, so it is kept
    watch_until(watcher, lambda: watcher.summary.skipped == 1)
    assert len(tasks.calls) == 2 and watcher.summary.analysed == 1
    assert list(read_table(root, "traces")["status"]) == ["ok"]


def test_a_task_that_keeps_dying_is_retried_then_given_up(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    one_rank(src / "dies.json.gz")
    one_rank(src / "fine.json.gz")
    (src / "broken.json").write_text("{")
    root = open_store(tmp_path / "store", create=True)
    tasks = Tasks()
    watcher = Watcher([str(src)], root, tasks.submit,
                      policy=WatchPolicy(settle_s=0, poll_s=0.01, max_poll_s=0.01, max_attempts=3, retry_s=0.01))
    watch_until(watcher, lambda: watcher.summary.given_up == 1 and watcher.summary.analysed == 2)
    assert tasks.calls.count(str(src / "dies.json.gz")) == 3
    assert tasks.calls.count(str(src / "broken.json")) == 1  # a broken file is not retried
    assert tasks.calls.count(str(src / "fine.json.gz")) == 1
    assert watcher.summary.retried == 2
    rows = read_table(root, "traces").set_index("path")
    assert rows.loc[str(src / "dies.json.gz"), "error"] == (
        "gave up after 3 attempts: task failed: RuntimeError: worker died")
    assert rows.loc[str(src / "dies.json.gz"), "status"] == "failed"
    assert "JSON" in rows.loc[str(src / "broken.json"), "error"]
    assert rows.loc[str(src / "fine.json.gz"), "status"] == "ok"


def test_work_in_flight_is_bounded(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for i in range(5):
        one_rank(src / f"t{i}.json.gz")
    root = open_store(tmp_path / "store", create=True)
    tasks = Tasks(hold=True)
    watcher = Watcher([str(src)], root, tasks.submit,
                      policy=WatchPolicy(settle_s=0, poll_s=0.01, max_poll_s=0.01, max_in_flight=2))
    stop, thread, _ = release_until_analysed(watcher, tasks, 5)
    stop.set()
    thread.join(60)
    assert watcher.summary.analysed == 5 and len(tasks.calls) == 5
    assert tasks.most_in_flight == 2


# --- compaction while watching ------------------------------------------------------------------------------------
PER_FILE_TABLES = ("traces", "findings", "steps", "summaries")  # what a one-rank job writes: one key per table


def parquet_names(root, table: str) -> list[str]:
    return sorted(p.name for p in (root / table).glob("*.parquet"))


def tables(root) -> dict:
    return {t: read_table(root, t).sort_values(["key", *(["step"] if t == "steps" else [])]).reset_index(drop=True)
            for t in PER_FILE_TABLES}


def drop(src: Path, name: str) -> None:
    """A one-rank job dropped into the watched folder whole (written beside it, then renamed in)."""
    staging = src.parent / "staging"
    staging.mkdir(exist_ok=True)
    one_rank(staging / name)
    (staging / name).rename(src / name)


def wait_until(done, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done()


def test_the_watch_compacts_every_n_files_and_when_quiet(tmp_path):
    """Jobs dropped into a folder; compact_every=3 and one file at a time: compactions after the 3rd and 6th files,
    the 7th waits for the quiet period. Each table's files are known at each point, and the rows never change."""
    src = tmp_path / "in"
    src.mkdir()
    root = open_store(tmp_path / "store", create=True)
    now = [0.0]
    events: list[tuple[str, str]] = []
    watcher = Watcher([str(src)], root, Tasks().submit, clock=lambda: now[0], on_event=lambda *e: events.append(e),
                      policy=WatchPolicy(settle_s=0, poll_s=0.01, max_poll_s=0.01, max_in_flight=1,
                                         compact_every=3, compact_quiet_s=100))
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        for i in range(2):
            drop(src, f"t{i}.json.gz")
        wait_until(lambda: watcher.summary.analysed == 2)
        listed = watcher.summary.listings
        wait_until(lambda: watcher.summary.listings >= listed + 3)
        assert watcher.summary.compactions == 0  # 2 files < 3, and not quiet for 100 s yet
        for table in PER_FILE_TABLES:
            names = parquet_names(root, table)
            assert len(names) == 2 and not any(n.startswith("part-") for n in names), names
        first_two = tables(root)

        for i in range(2, 7):
            drop(src, f"t{i}.json.gz")
        wait_until(lambda: watcher.summary.analysed == 7)
        assert watcher.summary.compactions == 2  # after the 3rd file and after the 6th
        for table in PER_FILE_TABLES:  # the 6th's compaction merged 3 singles and the first part: a part, + the 7th
            names = parquet_names(root, table)
            assert sorted(n.startswith("part-") for n in names) == [False, True], names
        before = tables(root)
        assert len(before["traces"]) == 7 and set(before["traces"]["status"]) == {"ok"}
        assert len(before["steps"]) == 7 * 3  # three profiled steps each

        now[0] = 150.0  # nothing written for 100 s: the 7th file is compacted too
        wait_until(lambda: watcher.summary.compactions == 3)
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    for table in PER_FILE_TABLES:
        (name,) = parquet_names(root, table)
        assert name.startswith("part-")
    after = tables(root)
    for table in PER_FILE_TABLES:  # the same rows, read from one part as from a part and a single file
        pd.testing.assert_frame_equal(after[table], before[table])
        mine = after[table][after[table]["key"].isin(first_two[table]["key"])].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, first_two[table])
    compacted = [text for kind, text in events if kind == "compacted"]
    assert compacted == [
        "3 file(s) analysed since the last compaction; merged traces 3, findings 3, steps 3, summaries 3",
        "3 file(s) analysed since the last compaction; merged traces 4, findings 4, steps 4, summaries 4",
        "1 file(s) analysed since the last compaction; merged traces 2, findings 2, steps 2, summaries 2"]
    assert watcher.summary.compactions == 3  # the clean stop had nothing new to compact
    assert watcher.summary.lines()[0].endswith("; store compacted 3 time(s)")


def test_the_watch_never_compacts_with_files_in_flight_and_a_failed_compaction_is_not_fatal(tmp_path, monkeypatch):
    from kinetoscope.batch import watch as watching

    src = tmp_path / "in"
    src.mkdir()
    for i in range(5):
        one_rank(src / f"t{i}.json.gz")  # there before the watch starts
    root = open_store(tmp_path / "store", create=True)
    now = [0.0]
    tasks, events = Tasks(hold=True), []
    watcher = Watcher([str(src)], root, tasks.submit, clock=lambda: now[0], on_event=lambda *e: events.append(e),
                      policy=WatchPolicy(settle_s=0, poll_s=0.01, max_poll_s=0.01, max_in_flight=2,
                                         compact_every=2, compact_quiet_s=100))
    calls: list[tuple[int, int]] = []  # (files in flight, futures not done) at each compaction
    real = watching.compact

    def compact(where, schemas):
        calls.append((len(watcher._in_flight), sum(not f.done() for f, _, _ in tasks.pending)))
        if len(calls) == 1:
            raise OSError("disk full")
        return real(where, schemas)

    monkeypatch.setattr(watching, "compact", compact)
    stop, thread, deadline = release_until_analysed(watcher, tasks, 5)
    # the first compaction failed (said, not fatal) and the work went on; its retry waits 100 s of quiet
    assert watcher.summary.analysed == 5 and thread.is_alive()
    assert (watcher.summary.compactions_failed, watcher.summary.compactions) == (1, 0)
    assert ("compact", "failed, tried again in 100 s: OSError: disk full") in events
    assert len(parquet_names(root, "traces")) == 5
    now[0] = 100.0
    while watcher.summary.compactions < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(60)
    assert calls == [(0, 0), (0, 0)]  # each with nothing in flight
    assert tasks.most_in_flight == 2
    (name,) = parquet_names(root, "traces")
    assert name.startswith("part-")
    assert sorted(read_table(root, "traces")["path"]) == sorted(str(src / f"t{i}.json.gz") for i in range(5))


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--compact-every", "0", "--max-attempts, --max-in-flight and --compact-every must be >= 1"),
    ("--compact-quiet", "-1", "--compact-quiet must be >= 0 seconds")])
def test_compaction_flags_are_checked(tmp_path, capsys, flag, value, message):
    pytest.importorskip("dask")
    from kinetoscope.cli import main

    assert main(["batch", str(tmp_path), "--store", str(tmp_path / "store"), "--watch", flag, value]) == 2
    assert capsys.readouterr().err == f"kinetoscope: error: {message}\n"
