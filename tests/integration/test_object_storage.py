"""Traces, stores and batch --watch in a real S3 API: moto's server, started and stopped here on 127.0.0.1.

The endpoint and dummy credentials are in this module's environment only (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...):
the code under test finds them as it would find a real bucket's, through the standard configuration.
"""

from __future__ import annotations

import gzip
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")
from tracebuilder import TraceBuilder, slow_loader_job  # noqa: E402

from kinetoscope.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
DDP = SAMPLES / "captures" / "ddp_straggler"  # a real 2-rank gloo capture: traces, manifests, step times
BUCKET = "traces"


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on a free port of 127.0.0.1, a bucket, and the environment pointing at it."""
    import s3fs

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
            mp.delenv(name, raising=False)
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        fs.mkdir(BUCKET)
        yield fs
        s3fs.S3FileSystem.clear_instance_cache()
    server.stop()


def upload(fs, local: Path, url: str) -> None:
    key = url.removeprefix("s3://")
    if local.is_dir():
        for f in sorted(local.iterdir()):
            if f.is_file():
                fs.put_file(str(f), f"{key}/{f.name}")
    else:
        fs.put_file(str(local), key)
    fs.invalidate_cache()



def test_analyze_by_url_is_the_local_report(s3, capsys, tmp_path):
    local = tmp_path / "ddp_straggler"
    shutil.copytree(DDP, local)
    url = f"s3://{BUCKET}/analyze/ddp_straggler"
    upload(s3, local, url)
    assert main(["analyze", str(local), "--format", "json"]) == 0
    expected = capsys.readouterr().out
    assert main(["analyze", url, "--format", "json"]) == 0
    got = capsys.readouterr().out
    # the same bytes but for where the files are (the report names its source and each rank's file)
    assert str(local) in expected
    assert got == expected.replace(str(local), url)


def test_diff_and_whatif_by_url_are_the_local_ones(s3, capsys):
    before, after = SAMPLES / "cpu" / "loader_bound", SAMPLES / "cpu" / "healthy"
    urls = {before: f"s3://{BUCKET}/pair/loader_bound", after: f"s3://{BUCKET}/pair/healthy"}
    for local, url in urls.items():
        upload(s3, local, url)

    def named_remote(text: str) -> str:
        for local, url in urls.items():
            text = text.replace(str(local), url)
        return text

    for argv in (["diff", "{before}", "{after}"], ["whatif", "{before}", "--fix", "loader_stall"]):
        local_code = main([a.format(before=before, after=after) for a in argv])
        expected = capsys.readouterr().out
        remote_code = main([a.format(before=urls[before], after=urls[after]) for a in argv])
        got = capsys.readouterr().out
        assert remote_code == local_code and expected.strip()
        assert got == named_remote(expected)


def test_a_remote_trace_is_streamed_in_ranged_reads(s3, monkeypatch):
    """The scan starts on the first block: no request reads the whole object."""
    import s3fs

    from kinetoscope import sources

    trace = SAMPLES / "real" / "v100_resnet50_2021.json.gz"  # 1.16 MB
    url = f"s3://{BUCKET}/stream/v100.json.gz"
    upload(s3, trace, url)
    ranges: list[tuple[int, int]] = []
    real = s3fs.core.S3File._fetch_range

    def recorded(self, start, end):
        ranges.append((start, end))
        return real(self, start, end)

    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", recorded)
    monkeypatch.setattr(sources, "BLOCK_BYTES", 128 * 1024)
    from kinetoscope.analyze.ingest.loader import load_trace

    remote = load_trace(url)
    local = load_trace(trace)
    size = trace.stat().st_size
    assert len(remote.ranks[0].events) == len(local.ranks[0].events)
    assert ranges[0][0] == 0 and ranges[0][1] < size  # the first request is one block or so, not the object
    assert len(ranges) >= 3
    assert max(end - start for start, end in ranges) < size


def test_url_errors_are_one_line_without_secrets(s3, capsys):
    assert main(["analyze", f"s3://AKIAEXAMPLE:hunter2@{BUCKET}/nothing/here.json?X-Amz-Signature=abc"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err
    assert "hunter2" not in err and "AKIAEXAMPLE" not in err and "Signature" not in err
    assert f"s3://{BUCKET}/nothing/here.json" in err


def test_a_missing_extra_is_named():
    code = ("import sys; sys.modules['s3fs'] = None\n"
            "from kinetoscope.cli import main\n"
            "sys.exit(main(['analyze', 's3://bucket/x.json.gz']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "pip install 'kinetoscope[s3]'" in proc.stderr, proc.stderr


@pytest.mark.app
def test_the_app_reads_a_store_in_the_bucket(s3, monkeypatch):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from kinetoscope.batch.store import open_store
    from kinetoscope.batch.task import analyze_file

    trace_url = f"s3://{BUCKET}/app/v100.json.gz"
    upload(s3, SAMPLES / "real" / "v100_resnet50_2021.json.gz", trace_url)
    store = open_store(f"s3://{BUCKET}/app-store", create=True)
    row = analyze_file(trace_url, "job-v100", 0, str(store))
    assert row["status"] == "ok" and row["content_sha256"] is None  # an object is known by its ETag, not read twice
    monkeypatch.setenv("KINETOSCOPE_APP_PATHS", str(store))
    at = AppTest.from_file(str(ROOT / "kinetoscope" / "app" / "main.py"), default_timeout=120)
    at.session_state["fleet_job"] = "job-v100"
    at.run()
    assert not at.exception and not at.error
    jobs = at.dataframe[0].value
    # the V100 sample's numbers, as the local store shows them (tests/integration/test_app.py)
    v100 = jobs.set_index("job").loc["job-v100"]
    assert v100["mean step (ms)"] == pytest.approx(174.829, abs=0.001)
    assert v100["worst finding"] == "warning gpu_idle"
    assert v100["worst saving (ms/step)"] == pytest.approx(58.82, abs=0.01)


@pytest.mark.slow
@pytest.mark.cluster
def test_batch_into_a_bucket_and_report(s3, tmp_path, capsys):
    pytest.importorskip("dask.distributed")
    from kinetoscope.batch import run_batch

    dump = tmp_path / "dump"
    slow_loader_job(dump / "job-a")
    (dump / "job-b").mkdir()
    (dump / "job-b" / "broken.json.gz").write_bytes(b"\x1f\x8b\x08\x00 truncated")
    for folder in ("job-a", "job-b"):
        upload(s3, dump / folder, f"s3://{BUCKET}/dump/{folder}")
    summary = run_batch([f"s3://{BUCKET}/dump"], f"s3://{BUCKET}/store", workers=1)
    assert (summary.jobs, summary.files, summary.ok, summary.failed) == (2, 4, 3, 1)
    assert main(["report", f"s3://{BUCKET}/store"]) == 0
    out = capsys.readouterr().out
    assert "2 jobs, 4 files: 3 ok, 1 failed" in out
    assert f"straggler in s3://{BUCKET}/dump/job-a: rank 1" in out
    assert f"s3://{BUCKET}/dump/job-b/broken.json.gz: " in out and "gzip" in out
    # the store is Parquet in the bucket, compacted at the batch's end: one part per table, the single files gone
    s3.invalidate_cache()
    (part,) = s3.ls(f"{BUCKET}/store/traces")
    assert part.rsplit("/", 1)[-1].startswith("part-") and s3.isfile(f"{BUCKET}/store/store.json")
    # --resume finds every file's row in the part, and analyses nothing again
    again = run_batch([f"s3://{BUCKET}/dump"], f"s3://{BUCKET}/store", workers=1, resume=True)
    assert (again.files, again.ok, again.failed, again.skipped) == (4, 3, 1, 4)


def _trace_row(key: str, mean_step_us: float) -> dict:
    return {"key": key, "job": "job", "path": f"/t/{key}.json", "rank": 0, "status": "ok", "mean_step_us": mean_step_us}


def _finding(key: str, fid: str) -> dict:
    return {"key": key, "job": "job", "path": f"/t/{key}.json", "rank": 0, "id": fid, "severity": "warning",
            "title": fid}


def _names(fs, folder: str) -> list[str]:
    fs.invalidate_cache()
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(folder))


@pytest.mark.slow
def test_a_store_in_the_bucket_is_compacted_and_its_newest_rows_win(s3):
    from kinetoscope.batch.compact import compact
    from kinetoscope.batch.store import SCHEMAS, open_store, read_rows, read_table, write_rows

    url = f"s3://{BUCKET}/compacted"
    root = open_store(url, create=True)
    for i in range(6):
        key = f"k{i:03d}"
        write_rows(root, "traces", key, [_trace_row(key, 1000.0 + i)])
        write_rows(root, "findings", key, [_finding(key, "gpu_idle"), _finding(key, "loader_stall")] if i % 2 else [])
    assert compact(root, SCHEMAS) == {"traces": 6, "findings": 6}
    (part,) = _names(s3, f"{BUCKET}/compacted/traces")
    assert part.startswith("part-") and len(_names(s3, f"{BUCKET}/compacted/findings")) == 1
    traces = read_table(url, "traces").sort_values("key")
    assert list(traces["key"]) == [f"k{i:03d}" for i in range(6)]
    assert list(traces["mean_step_us"]) == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0, 1005.0]
    findings = read_table(url, "findings")
    assert sorted(zip(findings["key"], findings["id"], strict=True)) == [
        ("k001", "gpu_idle"), ("k001", "loader_stall"), ("k003", "gpu_idle"), ("k003", "loader_stall"),
        ("k005", "gpu_idle"), ("k005", "loader_stall")]
    assert [r["mean_step_us"] for r in read_rows(root, "traces", "k003")] == [1003.0]  # --resume's look-up
    assert read_rows(root, "traces", "k999") is None

    # the moment between a compaction's upload and its deletes: a key in a single file and in the part reads once
    write_rows(root, "traces", "k004", [_trace_row("k004", 1004.0)])
    # a key rewritten after the compaction: its single file's rows win over the part's, an empty one too
    write_rows(root, "traces", "k002", [_trace_row("k002", 2002.0)])
    write_rows(root, "findings", "k001", [])
    # an older part (by name) that still holds k000 (a compaction's delete not yet done): the newer part's rows win
    import pyarrow as pa
    import pyarrow.parquet as pq

    with s3.open(f"{BUCKET}/compacted/traces/part-0000000000000000001-00000000.parquet", "wb") as stale:
        pq.write_table(pa.Table.from_pylist([_trace_row("k000", 1.0), _trace_row("k006", 1006.0)],
                                            schema=SCHEMAS["traces"]), stale)
    expected = [1000.0, 1001.0, 2002.0, 1003.0, 1004.0, 1005.0, 1006.0]
    traces = read_table(url, "traces").sort_values("key")
    assert list(traces["key"]) == [f"k{i:03d}" for i in range(7)]
    assert list(traces["mean_step_us"]) == expected
    assert [r["mean_step_us"] for r in read_rows(root, "traces", "k000")] == [1000.0]
    assert [r["mean_step_us"] for r in read_rows(root, "traces", "k002")] == [2002.0]
    assert read_rows(root, "findings", "k001") == []
    assert sorted(read_table(url, "findings")["key"]) == ["k003", "k003", "k005", "k005"]

    # compacting again merges the singles and both small parts into one part, with the same rows
    assert compact(root, SCHEMAS) == {"traces": 4, "findings": 2}
    (part,) = _names(s3, f"{BUCKET}/compacted/traces")
    assert part.startswith("part-")
    assert list(read_table(url, "traces").sort_values("key")["mean_step_us"]) == expected
    assert sorted(read_table(url, "findings")["key"]) == ["k003", "k003", "k005", "k005"]
    assert [r["mean_step_us"] for r in read_rows(root, "traces", "k002")] == [2002.0]
    assert read_rows(root, "findings", "k001") is None  # no rows anywhere now: the empty file merged into nothing
    assert not s3.exists(f"{BUCKET}/compacted/.compact.lock")
    # a raw read of the table's objects (what DuckDB's read_parquet over the URL sees) has each key once
    import pyarrow.dataset as ds
    raw = ds.dataset(f"{BUCKET}/compacted/traces", format="parquet", filesystem=s3).to_table()
    assert (raw.num_rows, sum(raw.column("mean_step_us").to_pylist())) == (7, sum(expected))


@pytest.mark.slow
def test_a_reader_that_listed_before_a_compaction_in_the_bucket_reads_every_row(s3):
    from kinetoscope.batch.compact import compact, newest_rows
    from kinetoscope.batch.store import SCHEMAS, open_store, write_rows

    root = open_store(f"s3://{BUCKET}/raced", create=True)
    for i in range(5):
        write_rows(root, "traces", f"k{i}", [_trace_row(f"k{i}", 100.0 + i)])
    listed = sorted(p for p in s3.ls(f"{BUCKET}/raced/traces"))  # a reader lists the five single files ...
    assert compact(root, SCHEMAS) == {"traces": 5}  # ... a compaction replaces them by a part, then it reads
    rows = newest_rows(listed, SCHEMAS["traces"], s3).to_pylist()
    assert sorted((r["key"], r["mean_step_us"]) for r in rows) == [(f"k{i}", 100.0 + i) for i in range(5)]


@pytest.mark.slow
def test_a_key_rewritten_during_a_compaction_in_the_bucket_keeps_its_new_rows(s3, monkeypatch):
    from kinetoscope.batch import compact as compaction
    from kinetoscope.batch.store import SCHEMAS, open_store, read_rows, read_table, write_rows

    root = open_store(f"s3://{BUCKET}/rewritten", create=True)
    for i in range(3):
        write_rows(root, "traces", f"k{i}", [_trace_row(f"k{i}", 100.0 + i)])
    merge = compaction._remote_newest_rows

    def rerun_lands(*args):  # a rerun of k1 writes its file after the compaction listed and read the folder
        rows = merge(*args)
        write_rows(root, "traces", "k1", [_trace_row("k1", 999.0)])
        return rows

    monkeypatch.setattr(compaction, "_remote_newest_rows", rerun_lands)
    assert compaction.compact(root, SCHEMAS) == {"traces": 3}
    names = _names(s3, f"{BUCKET}/rewritten/traces")
    assert len(names) == 2 and names[0] == "k1.parquet" and names[1].startswith("part-")  # the new k1 stayed
    assert [r["mean_step_us"] for r in read_rows(root, "traces", "k1")] == [999.0]
    assert sorted(read_table(root, "traces")["mean_step_us"]) == [100.0, 102.0, 999.0]


@pytest.mark.slow
def test_a_watch_compacts_its_store_in_the_bucket(s3, tmp_path):
    """Jobs uploaded while a watch runs (tasks in this process), the store in the bucket: with compact_every=2 the
    store holds a part after the 2nd file, a part and the 3rd file's objects after the 3rd, one part after the quiet
    period; every table reads the same rows throughout."""
    from concurrent.futures import Future

    import pandas as pd

    from kinetoscope.batch.store import open_store, read_table
    from kinetoscope.batch.watch import Watcher, WatchPolicy

    def run_here(fn, *args):
        fut: Future = Future()
        fut.set_result(fn(*args))
        return fut

    incoming, store = f"s3://{BUCKET}/compact-in", f"s3://{BUCKET}/compact-store"
    root = open_store(store, create=True)
    now = [0.0]
    watcher = Watcher([incoming], root, run_here, clock=lambda: now[0],
                      policy=WatchPolicy(settle_s=0, poll_s=0.05, max_poll_s=0.05, max_in_flight=1,
                                         compact_every=2, compact_quiet_s=100))
    tables = ("traces", "findings", "steps", "summaries")

    def read_all():
        return {t: read_table(store, t).sort_values(["key", *(["step"] if t == "steps" else [])])
                .reset_index(drop=True) for t in tables}

    def objects(table):
        names = _names(s3, f"{BUCKET}/compact-store/{table}")
        return sorted("part" if n.startswith("part-") else "single" for n in names)

    def wait_until(done):
        deadline = time.monotonic() + 120
        while not done() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done(), watcher.summary

    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        for i in range(3):
            b = TraceBuilder()
            for step in range(3):
                b.step(step, step * 1000, 1000).kernel(step * 1000 + 100, 500 + 100 * i, name="gemm")
            upload(s3, b.write(tmp_path / f"t{i}.json.gz"), f"{incoming}/t{i}.json.gz")  # one object: seen whole
            wait_until(lambda i=i: watcher.summary.analysed == i + 1)
            if i == 1:  # the 2nd file's rows written: the compaction comes next, before any other file starts
                wait_until(lambda: watcher.summary.compactions == 1)
                assert all(objects(t) == ["part"] for t in tables)
                two = read_all()
        assert watcher.summary.compactions == 1 and all(objects(t) == ["part", "single"] for t in tables)
        before = read_all()
        now[0] = 150.0  # quiet for 100 s: the 3rd file is compacted too
        wait_until(lambda: watcher.summary.compactions == 2)
    finally:
        stop.set()
        thread.join(120)
    assert all(objects(t) == ["part"] for t in tables)
    after = read_all()
    for t in tables:
        pd.testing.assert_frame_equal(after[t], before[t])
        pd.testing.assert_frame_equal(after[t][after[t]["key"].isin(two[t]["key"])].reset_index(drop=True), two[t])
    assert sorted(after["traces"]["mean_step_us"]) == [1000.0, 1000.0, 1000.0] and len(after["steps"]) == 9
    assert not s3.exists(f"{BUCKET}/compact-store/.compact.lock")


class Watch:
    """``kinetoscope batch --watch`` as a process, its event lines read as they come."""

    def __init__(self, roots: str, store: str, *extra: str) -> None:
        # its own process group: a Ctrl-C at a terminal reaches the whole group, the local workers too
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kinetoscope.cli", "batch", roots, "--store", store, "--watch", "--workers", "1",
             "--poll", "0.2", "--max-poll", "0.5", "--settle", "3600", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ), start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for(self, text: str, timeout_s: float = 180.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.proc.poll() is None, "".join(self.seen)
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no {text!r} in:\n{''.join(self.seen)}")

    def stop(self, sig: int = signal.SIGINT, group: bool = False) -> tuple[int, str]:
        if group:  # as a terminal's Ctrl-C: every process of the group
            os.killpg(self.proc.pid, sig)
        else:  # as a service manager's stop: the watch's own process
            self.proc.send_signal(sig)
        out, _ = self.proc.communicate(timeout=180)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return self.proc.returncode, out


@pytest.mark.slow
@pytest.mark.cluster
def test_watch_analyses_jobs_as_they_land(s3, tmp_path):
    pytest.importorskip("dask.distributed")
    from kinetoscope.batch.store import read_table

    incoming, store = f"s3://{BUCKET}/incoming", f"s3://{BUCKET}/watch-store"
    watch = Watch(incoming, store, "--retry-delay", "0.2", "--max-attempts", "2")
    try:
        watch.wait_for("no such file")  # nothing there yet: said, and listed again
        # a capture's job arriving: its traces first, no manifests yet (the run has not ended)
        for f in sorted(DDP.glob("rank-*.pt.trace.json.gz")):
            upload(s3, f, f"{incoming}/ddp/{f.name}")
        watch.wait_for(f"waiting: {incoming}/ddp: 2 file(s)")
        assert read_table(store, "traces").empty  # not analysed while it is incomplete
        for f in sorted(DDP.glob("rank-*.json")):  # the manifests and step times: the run ended
            upload(s3, f, f"{incoming}/ddp/{f.name}")
        watch.wait_for(f"job: {incoming}/ddp: complete, 2 of 2")
        watch.wait_for("ok: ")
        watch.wait_for("ok: ")
        # a broken capture: a failed row with its reason, never retried (the file, not the store, is at fault)
        (tmp_path / "broken").mkdir()
        (tmp_path / "broken" / "rank-0.step-1-2.pt.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": ['))
        (tmp_path / "broken" / "rank-0.manifest.json").write_bytes(b"{}")
        upload(s3, tmp_path / "broken", f"{incoming}/broken")
        failed = watch.wait_for("failed: ")
        assert f"{incoming}/broken/rank-0.step-1-2.pt.trace.json.gz" in failed and "ends early" in failed
        code, out = watch.stop(signal.SIGTERM)
    finally:
        if watch.proc.poll() is None:
            watch.proc.kill()
    assert code == 0, "".join(watch.seen)
    assert "1 failed" in out and "3 files analysed" in out
    assert not any("retry" in line for line in watch.seen)
    traces = read_table(store, "traces").set_index("path")
    assert sorted(traces["status"]) == ["failed", "ok", "ok"]
    assert "ends early" in traces.loc[f"{incoming}/broken/rank-0.step-1-2.pt.trace.json.gz", "error"]
    jobs = read_table(store, "jobs")
    assert list(jobs["job"]) == [f"{incoming}/ddp"] and int(jobs["straggler_rank"].iloc[0]) == 1

    # restarted: what the store holds is not analysed again
    again = Watch(incoming, store)
    try:
        again.wait_for(f"job: {incoming}/broken/rank-0.step-1-2.pt.trace.json.gz: complete")
        again.wait_for(f"job: {incoming}/ddp: complete")
        for _ in range(3):
            again.wait_for("kept: ")
        code, out = again.stop()
    finally:
        if again.proc.poll() is None:
            again.proc.kill()
    assert code == 0 and "0 files analysed" in out and "3 already in the store" in out, out


@pytest.mark.slow
@pytest.mark.cluster
def test_ctrl_c_mid_job_loses_nothing(s3, tmp_path):
    """Ctrl-C while a job's files are being analysed: the watch ends, every row written is whole, and the next start
    analyses exactly the files that have no row (each file once over the two runs)."""
    pytest.importorskip("dask.distributed")
    from kinetoscope.batch.store import read_table

    incoming, store = f"s3://{BUCKET}/ctrl-c", f"s3://{BUCKET}/ctrl-c-store"
    slow_loader_job(tmp_path / "job")
    upload(s3, tmp_path / "job", f"{incoming}/job")
    first = Watch(incoming, store, "--settle", "0", "--max-in-flight", "1")
    try:
        first.wait_for(f"job: {incoming}/job: complete, 3 of 3")
        code, out = first.stop(signal.SIGINT, group=True)
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    assert code == 0, "".join(first.seen)
    written = read_table(store, "traces")  # every object in the store reads whole
    assert len(written) == written["path"].nunique() and set(written["status"]) <= {"ok"}
    done = len(written)
    second = Watch(incoming, store, "--settle", "0")
    try:
        second.wait_for(f"job: {incoming}/job: complete, {3 - done} of 3")
        for _ in range(3 - done):
            second.wait_for("ok: ")
        code, out = second.stop()
    finally:
        if second.proc.poll() is None:
            second.proc.kill()
    assert code == 0
    assert f"{3 - done} files analysed" in out
    traces = read_table(store, "traces")
    assert sorted(traces["rank"]) == [0, 1, 2] and set(traces["status"]) == {"ok"}
    assert int(read_table(store, "jobs")["straggler_rank"].iloc[0]) == 1


@pytest.mark.slow
@pytest.mark.torch
def test_capture_out_to_a_bucket(s3, tmp_path):
    """Each file is uploaded once written, the manifest last; the training process never imports fsspec."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, time, torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class D(Dataset):\n"
        "    def __len__(self): return 40\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.004); return torch.randn(16), torch.randn(1)\n"
        "net = torch.nn.Linear(16, 1); opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x, y in DataLoader(D(), batch_size=4):\n"
        "    loss = torch.nn.functional.mse_loss(net(x), y); opt.zero_grad(); loss.backward(); opt.step()\n"
        "print('fsspec imported:', 'fsspec' in sys.modules)\n"
    )
    url = f"s3://{BUCKET}/capture/run-1"
    proc = subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli", "capture", "--out", url, "--skip-first", "1", "--wait", "0",
         "--warmup", "1", "--active", "3", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "fsspec imported: False" in proc.stdout
    assert f"uploaded 3 file(s) to {url}" in proc.stderr
    s3.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[-1] for p in s3.ls(url)) == [
        "rank-0.manifest.json", "rank-0.step-2-4.pt.trace.json.gz", "rank-0.steps.json"]
    from kinetoscope.analyze.ingest.loader import load_trace

    trace = load_trace(url)
    assert len(trace.ranks[0].steps) == 3 and trace.ranks[0].run_steps is not None
    again = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "capture", "--out", url, "--", sys.executable,
                            "-c", "pass"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds files" in again.stderr


def test_duckdb_queries_a_compacted_store_over_its_url(s3):
    """Issue 33: the store stays queryable by DuckDB over the URL. DuckDB given the store's fsspec filesystem (its
    own `register_filesystem`, no extension to download) reads the compacted part by its s3:// URL: 6 traces, 3 with
    two findings each, known by construction."""
    duckdb = pytest.importorskip("duckdb")
    from kinetoscope.batch.compact import compact
    from kinetoscope.batch.store import SCHEMAS, open_store, write_rows

    url = f"s3://{BUCKET}/queried"
    root = open_store(url, create=True)
    for i in range(6):
        key = f"k{i:03d}"
        write_rows(root, "traces", key, [_trace_row(key, 1000.0 + i)])
        write_rows(root, "findings", key, [_finding(key, "gpu_idle"), _finding(key, "loader_stall")] if i % 2 else [])
    compact(root, SCHEMAS)
    con = duckdb.connect()
    con.register_filesystem(s3)
    ((count, total),) = con.execute(f"SELECT count(*), sum(mean_step_us) FROM read_parquet('{url}/traces/*.parquet')"
                                    ).fetchall()
    assert (count, total) == (6, sum(1000.0 + i for i in range(6)))
    by_id = con.execute(f"SELECT id, count(*) FROM read_parquet('{url}/findings/*.parquet') "
                        "GROUP BY id ORDER BY id").fetchall()
    assert by_id == [("gpu_idle", 3), ("loader_stall", 3)]
