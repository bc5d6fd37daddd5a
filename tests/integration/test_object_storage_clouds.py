"""gs:// and az:// against real storage APIs on 127.0.0.1, started and stopped here: gcp-storage-emulator (PyPI) for
Google Cloud Storage, Azurite (npm) for Azure Blob. A job uploaded into a bucket (a container), analysed by URL,
batched into a store in the bucket, reported on; no secret in anything Kinetoscope prints or writes.

Each store's endpoint and credentials are set in this module's environment only, the way each ecosystem configures
them: gcsfs finds the emulator by STORAGE_EMULATOR_HOST (and anonymous access by fsspec's FSSPEC_GS_TOKEN); adlfs
finds Azurite's account by AZURE_STORAGE_CONNECTION_STRING. The tests of a store skip, saying what to install, where
its extra or its emulator is missing: ``pip install 'kinetoscope[gcs]' gcp-storage-emulator`` and
``pip install 'kinetoscope[azure]'`` with ``npm install -g azurite``. (S3, moto's server: test_object_storage.py.)
"""

from __future__ import annotations

import base64
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tracebuilder import TraceBuilder, slow_loader_job

from kinetoscope.cli import main

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
DDP = SAMPLES / "captures" / "ddp_straggler"  # a real 2-rank gloo capture: traces, manifests, step times
BUCKET = "traces"
#: Azurite's account for these tests, and its key: a secret that must appear in nothing Kinetoscope prints or writes
AZURE_ACCOUNT = "kinetoscope"
AZURE_KEY = base64.b64encode(b"kinetoscope-test-account-key-do-not-print").decode()


@dataclass
class Store:
    protocol: str
    fs: Any  # the store's fsspec filesystem, for the test's own uploads and listings

    def url(self, key: str) -> str:
        return f"{self.protocol}://{BUCKET}/{key}"

    def upload(self, local: Path, key: str) -> None:
        files = sorted(f for f in local.iterdir() if f.is_file()) if local.is_dir() else [local]
        for f in files:
            self.fs.put_file(str(f), f"{BUCKET}/{key}/{f.name}" if local.is_dir() else f"{BUCKET}/{key}")
        self.fs.invalidate_cache()

    def names(self, key: str) -> list[str]:
        self.fs.invalidate_cache()
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(f"{BUCKET}/{key}"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(argv: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """An emulator's process, once it accepts connections on 127.0.0.1:``port`` (60 s at most)."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{argv[0]} did not listen on 127.0.0.1:{port} within 60 s")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def _gcs() -> Iterator[Store]:
    missing = [m for m in ("gcsfs", "gcp_storage_emulator") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"gs:// tests need {' and '.join(missing)}: pip install 'kinetoscope[gcs]' gcp-storage-emulator")
    port = _free_port()
    # the emulator serves one connection at a time with no timeout: a client that opens a connection and drops its
    # request (a read-ahead cancelled) would stall every other client. A threading server serves each on its own.
    launch = ("import http.server, sys; http.server.HTTPServer = http.server.ThreadingHTTPServer; "
              "from gcp_storage_emulator.__main__ import main; sys.exit(main())")
    proc = _serve([sys.executable, "-c", launch, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory",
                   "--quiet", "--default-bucket", BUCKET], port)
    import fsspec.config

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        # anonymous, never Google's metadata server or gcloud's credentials (in this process, and in Dask's workers
        # through the environment); no probe of the hierarchical-namespace API, which the emulator does not serve
        mp.setenv("FSSPEC_GS_TOKEN", "anon")
        mp.setitem(fsspec.config.conf, "gs", {**fsspec.config.conf.get("gs", {}), "token": "anon"})
        mp.setenv("NO_GCE_CHECK", "true")
        mp.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        import gcsfs

        gcsfs.GCSFileSystem.clear_instance_cache()
        try:
            yield Store("gs", gcsfs.GCSFileSystem())
        finally:
            gcsfs.GCSFileSystem.clear_instance_cache()
            _stop(proc)


def _azure() -> Iterator[Store]:
    azurite = shutil.which("azurite-blob")
    if importlib.util.find_spec("adlfs") is None or azurite is None:
        pytest.skip("az:// tests need adlfs and Azurite: pip install 'kinetoscope[azure]'; npm install -g azurite")
    port = _free_port()
    proc = _serve([azurite, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence", "--silent",
                   "--skipApiVersionCheck", "--disableTelemetry"], port,
                  env={**os.environ, "AZURITE_ACCOUNTS": f"{AZURE_ACCOUNT}:{AZURE_KEY}"})
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("AZURE_STORAGE_")]:
            mp.delenv(name)
        mp.setenv("AZURE_STORAGE_CONNECTION_STRING",
                  f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};"
                  f"BlobEndpoint=http://127.0.0.1:{port}/{AZURE_ACCOUNT};")
        import adlfs

        adlfs.AzureBlobFileSystem.clear_instance_cache()
        fs = adlfs.AzureBlobFileSystem()
        fs.mkdir(BUCKET)
        try:
            yield Store("az", fs)
        finally:
            adlfs.AzureBlobFileSystem.clear_instance_cache()
            _stop(proc)


@pytest.fixture(scope="module", params=["gs", "az"])
def store(request) -> Iterator[Store]:
    yield from (_gcs() if request.param == "gs" else _azure())



def test_analyze_by_url_is_the_local_report(store, capsys, tmp_path):
    local = tmp_path / "ddp_straggler"
    shutil.copytree(DDP, local)
    store.upload(local, "analyze/ddp_straggler")
    url = store.url("analyze/ddp_straggler")
    assert main(["analyze", str(local), "--format", "json"]) == 0
    expected = capsys.readouterr().out
    assert main(["analyze", url, "--format", "json"]) == 0
    got = capsys.readouterr().out
    # the same bytes but for where the files are (the report names its source and each rank's file)
    assert str(local) in expected
    assert got == expected.replace(str(local), url)


def test_a_remote_trace_is_streamed_in_ranged_reads(store, monkeypatch):
    """The scan starts on the first block: no request reads the whole object (each store's file class records the
    ranges it fetches)."""
    from kinetoscope import sources
    from kinetoscope.analyze.ingest.loader import load_trace

    if store.protocol == "gs":
        import gcsfs.core

        file_class: Any = gcsfs.core.GCSFile
    else:
        import adlfs.spec

        file_class = adlfs.spec.AzureBlobFile
    trace = SAMPLES / "real" / "v100_resnet50_2021.json.gz"  # 1.16 MB
    store.upload(trace, "stream/v100.json.gz")
    ranges: list[tuple[int, int]] = []
    real = file_class._fetch_range

    def recorded(self, start, end, *args, **kwargs):
        ranges.append((start, end))
        return real(self, start, end, *args, **kwargs)

    monkeypatch.setattr(file_class, "_fetch_range", recorded)
    monkeypatch.setattr(sources, "BLOCK_BYTES", 128 * 1024)
    remote = load_trace(store.url("stream/v100.json.gz"))
    local = load_trace(trace)
    size = trace.stat().st_size
    assert len(remote.ranks[0].events) == len(local.ranks[0].events)
    assert ranges[0][0] == 0 and ranges[0][1] < size  # the first request is one block or so, not the object
    assert len(ranges) >= 3
    assert max(end - start for start, end in ranges) < size


def test_an_azure_url_that_names_its_account(store, capsys):
    """``az://CONTAINER@ACCOUNT.blob.core.windows.net/path`` (the form Azure's tools print) reads the same objects
    as ``az://CONTAINER/path``, and is shown whole: the container is no secret."""
    if store.protocol != "az":
        pytest.skip("Azure's URL form")
    store.upload(DDP, "qualified/ddp")
    short, qualified = store.url("qualified/ddp"), f"az://{BUCKET}@{AZURE_ACCOUNT}.blob.core.windows.net/qualified/ddp"
    assert main(["analyze", short, "--format", "json"]) == 0
    expected = capsys.readouterr().out
    assert main(["analyze", qualified, "--format", "json"]) == 0
    assert capsys.readouterr().out == expected.replace(short, qualified)


def test_url_errors_are_one_line_without_secrets(store, capsys):
    assert main(["analyze", f"{store.protocol}://someone:hunter2@{BUCKET}/nothing/here.json?sig=abc"]) == 2
    err = capsys.readouterr().err
    assert err == f"kinetoscope: error: {store.url('nothing/here.json')}: no such file or directory\n"


@pytest.mark.slow
@pytest.mark.cluster
def test_batch_into_the_bucket_and_report(store, tmp_path, capsys):
    pytest.importorskip("dask.distributed")
    from kinetoscope.batch import run_batch
    from kinetoscope.batch.store import read_table

    dump = tmp_path / "dump"
    slow_loader_job(dump / "job-a")
    (dump / "job-b").mkdir()
    (dump / "job-b" / "broken.json.gz").write_bytes(b"\x1f\x8b\x08\x00 truncated")
    for folder in ("job-a", "job-b"):
        store.upload(dump / folder, f"dump/{folder}")
    summary = run_batch([store.url("dump")], store.url("store"), workers=1)
    assert (summary.jobs, summary.files, summary.ok, summary.failed) == (2, 4, 3, 1)
    assert main(["report", store.url("store")]) == 0
    out = capsys.readouterr().out
    assert "2 jobs, 4 files: 3 ok, 1 failed" in out
    assert f"straggler in {store.url('dump/job-a')}: rank 1" in out
    assert f"{store.url('dump/job-b/broken.json.gz')}: " in out and "gzip" in out
    # the store is Parquet in the bucket, compacted at the batch's end: one part per table
    (part,) = store.names("store/traces")
    assert part.startswith("part-") and "store.json" in store.names("store")
    traces = read_table(store.url("store"), "traces").set_index("path")
    assert sorted(traces["status"]) == ["failed", "ok", "ok", "ok"]
    assert list(read_table(store.url("store"), "jobs")["straggler_rank"]) == [1]
    # --resume finds every file's row in the part (by each object's version), and analyses nothing again
    again = run_batch([store.url("dump")], store.url("store"), workers=1, resume=True)
    assert (again.files, again.ok, again.failed, again.skipped) == (4, 3, 1, 4)
    # no secret in the store: every string it holds (paths, errors, evidence), read back
    for table in ("traces", "findings", "jobs"):
        for value in read_table(store.url("store"), table).to_numpy().ravel():
            assert AZURE_KEY not in str(value) and "AccountKey" not in str(value)


@pytest.mark.slow
def test_a_watch_on_the_bucket_analyses_what_lands_and_compacts(store, tmp_path):
    """A watch (tasks in this process) over a prefix, its store in the bucket, compact_every=2: two one-rank jobs
    uploaded while it runs are analysed once each and leave one part per table; a third, once quiet, too."""
    from concurrent.futures import Future

    from kinetoscope.batch.store import open_store, read_table
    from kinetoscope.batch.watch import Watcher, WatchPolicy

    def run_here(fn, *args):
        fut: Future = Future()
        fut.set_result(fn(*args))
        return fut

    root = open_store(store.url("watch-store"), create=True)
    now = [0.0]
    events: list[tuple[str, str]] = []
    watcher = Watcher([store.url("watch-in")], root, run_here, clock=lambda: now[0],
                      on_event=lambda *e: events.append(e),
                      policy=WatchPolicy(settle_s=0, poll_s=0.05, max_poll_s=0.05, max_in_flight=1,
                                         compact_every=2, compact_quiet_s=100))

    def wait_until(done):
        deadline = time.monotonic() + 120
        while not done() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done(), (watcher.summary, events)

    tables = ("traces", "findings", "steps", "summaries")
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        for i in range(3):
            b = TraceBuilder()
            for step in range(3):
                b.step(step, step * 1000, 1000).kernel(step * 1000 + 100, 500, name="gemm")
            store.upload(b.write(tmp_path / f"t{i}.json.gz"), f"watch-in/t{i}.json.gz")
            wait_until(lambda i=i: watcher.summary.analysed == i + 1)
        wait_until(lambda: watcher.summary.compactions == 1)
        assert all(sorted(n.startswith("part-") for n in store.names(f"watch-store/{t}")) == [False, True]
                   for t in tables)
        now[0] = 150.0
        wait_until(lambda: watcher.summary.compactions == 2)
    finally:
        stop.set()
        thread.join(120)
    assert all(len(store.names(f"watch-store/{t}")) == 1 for t in tables)
    traces = read_table(store.url("watch-store"), "traces")
    assert sorted(traces["path"]) == [store.url(f"watch-in/t{i}.json.gz") for i in range(3)]
    assert set(traces["status"]) == {"ok"} and len(read_table(store.url("watch-store"), "steps")) == 9
    assert watcher.summary.listings > 3 and watcher.summary.analysed == 3  # listed again and again, analysed once


def test_no_secret_in_what_an_azure_failure_prints(store, tmp_path, capsys, monkeypatch):
    """A wrong account key: the store refuses, and the one-line error names the URL and the failure, not the key
    or the connection string."""
    if store.protocol != "az":
        pytest.skip("the connection string with a key is Azure's")
    import adlfs

    store.upload(SAMPLES / "real" / "v100_resnet50_2021.json.gz", "secret/v100.json.gz")
    wrong = base64.b64encode(b"a-wrong-key-that-must-not-be-printed").decode()
    right = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", right.replace(AZURE_KEY, wrong))
    adlfs.AzureBlobFileSystem.clear_instance_cache()
    try:
        code = main(["analyze", store.url("secret/v100.json.gz")])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"kinetoscope: error: {store.url('secret/v100.json.gz')}: ")
        for secret in (wrong, AZURE_KEY, "AccountKey", "SharedKey"):
            assert secret not in err, err
        code = main(["batch", store.url("secret"), "--store", str(tmp_path / "local-store"), "--workers", "1"])
        out, err = capsys.readouterr()
        for secret in (wrong, AZURE_KEY, "AccountKey"):
            assert secret not in out and secret not in err
    finally:
        adlfs.AzureBlobFileSystem.clear_instance_cache()


@pytest.mark.parametrize(("url", "module", "extra"), [("gs://bucket/x.json.gz", "gcsfs", "gcs"),
                                                      ("az://container/x.json.gz", "adlfs", "azure")])
def test_a_missing_extra_is_named(url, module, extra):
    pytest.importorskip("fsspec")
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from kinetoscope.cli import main\n"
            f"sys.exit(main(['analyze', {url!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == f"kinetoscope: error: {url}: {url.split(':')[0]}:// URLs need {module}: " \
                          f"pip install 'kinetoscope[{extra}]'\n", proc.stderr
