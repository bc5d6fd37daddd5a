"""Batch on Dask: a real LocalCluster, and a scheduler plus workers as separate processes on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("dask.distributed")
from tracebuilder import TraceBuilder, slow_loader_job  # noqa: E402

from kinetoscope.batch import discover, run_batch  # noqa: E402
from kinetoscope.batch.report import fleet, store_report  # noqa: E402
from kinetoscope.batch.store import read_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"

pytestmark = pytest.mark.cluster



@pytest.fixture
def dump(tmp_path):
    root = tmp_path / "dump"
    slow_loader_job(root / "job-a")
    shutil.copy(SAMPLES / "real" / "v100_resnet50_2021.json.gz", root / "single.json.gz")
    (root / "job-b").mkdir()
    (root / "job-b" / "broken.json.gz").write_bytes(b"\x1f\x8b\x08\x00 truncated")
    (root / "job-b" / "empty.json").write_bytes(b"")
    (root / "notes.txt").write_text("not a trace")
    return root


def test_discover_groups_rank_files_and_keeps_lone_traces(dump):
    jobs = {Path(j.name).name: len(j.files) for j in discover([dump])}
    assert jobs == {"job-a": 3, "single.json.gz": 1, "broken.json.gz": 1, "empty.json": 1}


@pytest.mark.slow
def test_local_cluster_batch_rows_statuses_straggler_and_resume(dump, tmp_path):
    store = tmp_path / "store"
    summary = run_batch([dump], store, workers=2)
    assert (summary.jobs, summary.files, summary.ok, summary.failed) == (4, 6, 4, 2)
    traces = read_table(store, "traces")
    assert len(traces) == 6
    assert sorted(traces["status"]) == ["failed", "failed", "ok", "ok", "ok", "ok"]
    failed = traces[traces["status"] == "failed"]
    failed = failed.set_index(failed["path"].map(lambda p: Path(p).name))
    assert "gzip" in failed.loc["broken.json.gz", "error"] and "empty" in failed.loc["empty.json", "error"]
    job_a = traces[traces["job"].str.endswith("job-a")]
    assert sorted(job_a["rank"]) == [0, 1, 2]
    findings = read_table(store, "findings")
    straggler = findings[findings["id"] == "straggler"]
    assert list(straggler["rank"]) == [1] and straggler["job"].iloc[0].endswith("job-a")
    steps = read_table(store, "steps")
    assert len(steps[steps["job"].str.endswith("job-a")]) == 9
    assert "straggler in" in store_report(store)
    duckdb = pytest.importorskip("duckdb")
    counts = duckdb.sql(f"SELECT status, count(*) FROM read_parquet('{store}/traces/*.parquet') "
                        "GROUP BY status ORDER BY status").fetchall()
    assert counts == [("failed", 2), ("ok", 4)]
    table = fleet(store)
    assert set(table.columns) >= {"job", "files", "failed", "critical", "warnings", "straggler"}

    files_before = sorted(p.name for p in (store / "traces").iterdir())
    again = run_batch([dump], store, workers=2, resume=True)
    assert again.skipped == 6 and (again.ok, again.failed) == (4, 2)
    assert sorted(p.name for p in (store / "traces").iterdir()) == files_before
    assert len(read_table(store, "findings")[lambda f: f["id"] == "straggler"]) == 1


def test_a_directory_that_is_not_a_store_is_refused(tmp_path, dump):
    other = tmp_path / "precious"
    other.mkdir()
    (other / "data.txt").write_text("keep me")
    from kinetoscope.errors import TraceSourceError

    with pytest.raises(TraceSourceError, match="not a Kinetoscope store"):
        run_batch([dump], other, workers=1)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_scheduler_and_workers_as_processes_survive_a_killed_worker(tmp_path):
    root = tmp_path / "many"
    for i in range(24):
        b = TraceBuilder()
        for step in range(40):
            t = step * 1000
            b.step(step, t, 1000).loader(t, 100).kernel(t + 100, 800, launch_at=t + 100)
        b.write(root / f"run{i:02d}.json.gz")
    port = _port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                               "--port", str(port), "--no-dashboard"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        time.sleep(3)
        workers = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
                                     "--no-nanny", "--no-dashboard", "--host", "127.0.0.1"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
        procs += workers
        time.sleep(4)
        store = tmp_path / "store"
        batch = subprocess.Popen([sys.executable, "-m", "kinetoscope.cli", "batch", str(root), "--store", str(store),
                                  "--scheduler", address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(batch)
        # kill a worker once results start arriving
        deadline = time.time() + 120
        while time.time() < deadline and not list((store / "traces").glob("*.parquet")):
            time.sleep(0.05)
        workers[0].send_signal(signal.SIGKILL)
        out, err = batch.communicate(timeout=240)
        assert batch.returncode == 0, err[-2000:]
        traces = read_table(store, "traces")
        assert len(traces) == 24
        assert (traces["status"] == "ok").all(), traces[traces["status"] != "ok"]["error"].tolist()
        assert "24 ok, 0 failed" in out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.slow
def test_cli_batch_and_report(dump, tmp_path):
    store = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "batch", str(dump), "--store", str(store),
                           "--workers", "1", "--quiet"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "6 files: 4 ok, 2 failed" in proc.stdout
    report = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "report", str(store)],
                            capture_output=True, text=True)
    assert report.returncode == 0 and "straggler in" in report.stdout
    bad = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "report", str(dump)], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a Kinetoscope store" in bad.stderr and "Traceback" not in bad.stderr


def _comparable(store: Path, table: str):
    """A table without its timings (seconds measured on whichever machine ran it), in a stable order."""
    frame = read_table(store, table).drop(columns=["parse_s", "analyze_s", "reduce_s"], errors="ignore")
    return frame.sort_values([c for c in ("key", "rank", "step", "id") if c in frame]).reset_index(drop=True)


def _dask_cli() -> list[str]:
    return [sys.executable, "-m", "dask"]  # the `dask` command users run (`dask scheduler`, `dask worker`)


@pytest.mark.slow
def test_dask_scheduler_and_worker_commands_give_the_local_runs_results_exactly(dump, tmp_path):
    """A cluster started as deploy/README.md starts it: `dask scheduler`, `dask worker` (with its nanny, two worker
    processes, the malloc settings and the preload), then `kinetoscope batch --scheduler`: every table equals a
    local run's, and the batch has no advice about the workers' allocator."""
    from kinetoscope.batch.run import MALLOC_ENV

    local = tmp_path / "local"
    run_batch([dump], local, workers=1)
    port = _port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, **MALLOC_ENV}
    procs = [subprocess.Popen([*_dask_cli(), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        procs.append(subprocess.Popen([*_dask_cli(), "worker", address, "--nworkers", "2", "--nthreads", "1",
                                       "--no-dashboard", "--host", "127.0.0.1", "--preload", "kinetoscope.batch.task"],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from dask.distributed import Client

        with Client(address, timeout="60s") as client:
            client.wait_for_workers(2, timeout=120)
        remote = tmp_path / "remote"
        out = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "batch", str(dump), "--store", str(remote),
                              "--scheduler", address, "--quiet"], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "6 files: 4 ok, 2 failed" in out.stdout and "note:" not in out.stdout
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    for table in ("traces", "findings", "steps", "summaries", "job_ranks", "jobs"):
        a, b = _comparable(local, table), _comparable(remote, table)
        assert len(a) > 0, table
        assert a.equals(b), table
    # both stores were compacted: one part per table, and DuckDB reads them as the tool does
    assert [p.name[:5] for p in (remote / "traces").glob("*.parquet")] == ["part-"]
    duckdb = pytest.importorskip("duckdb")
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{remote}/steps/*.parquet')").fetchall() == [
        (len(_comparable(local, "steps")),)]


def test_the_local_batchs_workers_start_with_the_deployment_settings():
    """`kinetoscope batch --workers N` starts its workers as deploy/README.md starts a cluster's: glibc's malloc
    thresholds at 32 MiB, no statistical profiler, Dask's upkeep slowed (tick 1 s, system monitor 5 s, memory
    monitor 1 s). Read back in the worker processes themselves."""
    from kinetoscope.batch.run import _client

    client, cluster = _client(None, 1)
    try:
        def settings():
            import os

            import dask

            return ({k: dask.config.get(k) for k in ("distributed.worker.profile.enabled",
                                                    "distributed.admin.tick.interval",
                                                    "distributed.admin.system-monitor.interval",
                                                    "distributed.worker.memory.monitor-interval")},
                    {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")})

        (seen,) = client.run(settings).values()
        assert seen == ({"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
                         "distributed.admin.system-monitor.interval": "5s",
                         "distributed.worker.memory.monitor-interval": "1s"},
                        {"MALLOC_TRIM_THRESHOLD_": "33554432", "MALLOC_MMAP_THRESHOLD_": "33554432"})
    finally:
        client.close()
        cluster.close()
