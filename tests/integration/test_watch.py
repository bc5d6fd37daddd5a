"""The watch's policy on local folders, its tasks run in this process: settle time, once per file version,
retries with a limit, work in flight bounded. (Against S3, through the CLI and Dask: test_object_storage.py.)"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path

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
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while watcher.summary.analysed < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
        tasks.release_one()
    stop.set()
    thread.join(60)
    assert watcher.summary.analysed == 5 and len(tasks.calls) == 5
    assert tasks.most_in_flight == 2
