"""Issue 16: bounded memory, no prompts, no leaks, no process-wide side effects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_traces" / "real" / "v100_resnet50_2021.json.gz"


def _python(code: str, *args: str, timeout: int = 300, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_process_analysing_traces_one_after_another_stays_flat():
    """Was: module-level caches kept every analysed trace's views (RSS +47% over 30 traces of 35 MB)."""
    out = _python("""
        import gc, sys
        from kinetoscope.analyze.loader import load_trace
        from kinetoscope.analyze.report import build_report
        def rss():
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS"):
                    return int(line.split()[1])
        marks = {}
        for i in range(1, 31):
            report = build_report(load_trace(sys.argv[1]))
            del report
            gc.collect()
            if i in (5, 30):
                marks[i] = rss()
        print(marks[5], marks[30])
    """, str(SAMPLE))
    after5, after30 = map(int, out.split())
    assert after30 <= after5 * 1.10, (after5, after30)


def test_views_live_and_die_with_their_trace():
    import gc
    import weakref

    from kinetoscope.analyze.loader import load_trace
    from kinetoscope.analyze.report import build_report

    trace = load_trace(SAMPLE)
    build_report(trace)
    assert trace.ranks[0]._views  # computed once, kept by the trace
    ref = weakref.ref(trace.ranks[0])
    del trace
    gc.collect()
    assert ref() is None  # nothing else holds it


def test_no_process_wide_state_changes_while_loading_and_writing(tmp_path):
    """Was: the reference decoder raised the process-wide recursion limit; atomic writes set umask(0)."""
    out = _python("""
        import os, sys, threading
        from pathlib import Path
        from kinetoscope.analyze.loader import load_trace
        from kinetoscope.fsutil import atomic_write
        seen = set()
        stop = threading.Event()
        def watch():  # another thread, as in the app: it must never see a different value
            while not stop.is_set():
                seen.add(sys.getrecursionlimit())
                m = os.umask(0o022); os.umask(m); seen.add(("umask", m))
        t = threading.Thread(target=watch); t.start()
        os.environ["KINETOSCOPE_DECODER"] = "reference"
        for _ in range(5):
            load_trace(sys.argv[1])
            atomic_write(Path(sys.argv[2]) / "f.bin", b"x")
        stop.set(); t.join()
        print(sorted(map(str, seen)))
        print(oct(os.stat(Path(sys.argv[2]) / "f.bin").st_mode & 0o777))
    """, str(ROOT / "sample_traces" / "real" / "h100_tiny_before_fix_trace.json"), str(tmp_path))
    values, mode = out.strip().splitlines()
    assert values == str(sorted(map(str, {1000, ("umask", 0o022)}))), values
    assert mode == "0o644"  # 0666 less the umask, applied by the kernel


def test_max_depth_is_capped_instead_of_crashing(tmp_path):
    """Was: --max-depth 10000000 on a deeply nested file: a segfault (exit 139) in both decoders."""
    deep = tmp_path / "deep.json"
    deep.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"x": '
                    + "[" * 200_000 + "]" * 200_000 + "}}]}")
    for env in ({}, {"KINETOSCOPE_DECODER": "reference"}):
        proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "analyze", "--max-depth", "10000000", str(deep)],
                              capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        assert proc.returncode == 2 and "max_depth must be <= 900" in proc.stderr
        proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "analyze", "--max-depth", "900", str(deep)],
                              capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        assert proc.returncode == 2 and "nested deeper than 900 levels" in proc.stderr, proc.stderr


def test_options_needing_pyarrow_say_so_in_one_line(tmp_path):
    """Was: 'internal error (ImportError)', exit 1."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "pyarrow.py").write_text("raise ImportError('pyarrow is blocked for this test')\n")
    (blocker / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class _Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pyarrow' or name.startswith('pyarrow.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Block())\n")
    env = {**os.environ, "PYTHONPATH": str(blocker), "KINETOSCOPE_CACHE_DIR": str(tmp_path / "cache")}
    for option in (["--cache"], ["--processes", "2"]):
        proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "analyze", *option, str(SAMPLE)],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "needs pyarrow: pip install 'kinetoscope[app]'" in proc.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_app_serves_on_a_fresh_machine_with_no_prompt(tmp_path):
    """Was: Streamlit's first-run 'Email:' prompt stopped `kinetoscope app` (and scripts/run-app) before it served."""
    pytest.importorskip("streamlit")
    port = _free_port()
    home = tmp_path / "home"  # no ~/.streamlit/credentials.toml: a fresh machine
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "BROWSER": "true"}  # a browser that does nothing
    proc = subprocess.Popen([sys.executable, "-m", "kinetoscope.cli", "app", "--port", str(port)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 90
        served = False
        while time.time() < deadline and not served:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    served = r.status == 200
            except OSError:
                time.sleep(0.5)
        assert served, "the app did not serve within 90 s"
    finally:
        proc.terminate()
        try:
            output = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            output = proc.communicate()[0]
    assert "Email" not in output and "Welcome to Streamlit" not in output


def _zero_bomb(path: Path, gunzipped: int = 2 * 2**30) -> None:
    """A gzip file of zeros: gzip members concatenated (their outputs concatenate), 16 MiB each."""
    import gzip

    member = gzip.compress(b"\0" * 2**24, compresslevel=9)
    path.write_bytes(member * (gunzipped // 2**24))


def test_every_hostile_file_is_refused_within_2_s_and_300_mb_at_default_limits(tmp_path):
    """Was: a 2 MB gzip of zeros took 21 s and 4.3 GB before 'not a JSON trace'."""
    from hostile import write_corpus

    corpus = write_corpus(tmp_path / "corpus")
    _zero_bomb(tmp_path / "corpus" / "zeros_bomb.json.gz")
    slow = []
    for name in sorted(corpus) + ["zeros_bomb.json.gz"]:
        seconds, peak_mb, outcome = json.loads(_python("""
            import json, sys, time
            from pathlib import Path
            from kinetoscope.analyze.loader import load_trace
            from kinetoscope.errors import KinetoscopeError
            started = time.perf_counter()
            try:
                load_trace(Path(sys.argv[1]))
                outcome = "ok"
            except KinetoscopeError as exc:
                outcome = str(exc)
            peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
            print(json.dumps([time.perf_counter() - started, peak / 1024, outcome]))
        """, str(tmp_path / "corpus" / name)))
        if seconds > 2.0 or peak_mb > 300:
            slow.append((name, round(seconds, 2), round(peak_mb), outcome[:80]))
    assert slow == []


# --- redaction: every string, every form ----------------------------------------------------------
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
AZURE_KEY = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopqrstuvwxyz=="


@pytest.mark.parametrize("text, secret, kept", [
    ("python train.py --hf_token hf_abcdefghijklmnopqrstuvwxyz0123 --lr 0.1", "hf_abcdef", "--lr 0.1"),
    (f"Authorization: Bearer {JWT}", "eyJhbGci", "Authorization: Bearer "),
    ("postgresql://user:s3cret@host/db", "s3cret", "postgresql://user:"),
    (f"DefaultEndpointsProtocol=https;AccountName=foo;AccountKey={AZURE_KEY};EndpointSuffix=core.windows.net",
     "abcdefghijklmnop", "AccountName=foo"),
    ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_", "token "),
    ("github_pat_11ABCDEFG0abcdefghijkl_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRS", "github_pat_", ""),
    ("OPENAI_API_KEY is sk-abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRST", "sk-abc", "OPENAI_API_KEY is "),
    ("AKIAIOSFODNN7EXAMPLE", "AKIA", ""),
    ("xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx", "xoxb-", ""),
    ("export HF_TOKEN=abc123def456 && python x.py", "abc123def456", "python x.py"),
    ("--password hunter2 --epochs 3", "hunter2", "--epochs 3"),
])
def test_each_form_of_secret_is_redacted_and_the_rest_kept(text, secret, kept):
    from kinetoscope.analyze.redact import REDACTED, redact_text

    out = redact_text(text)
    assert secret not in out and REDACTED in out and kept in out


@pytest.mark.parametrize("text", ["aten::mm", "ProfilerStep#5", "python train.py --token-budget 512 --max_tokens 64",
                                  "AWS_REGION=us-east-1", "tokenizer_config.json", "the auth module",
                                  "void at::native::elementwise_kernel<128, 2>(int)"])
def test_what_is_not_a_secret_is_left_alone(text):
    from kinetoscope.analyze.redact import redact_text

    assert redact_text(text) == text


def test_redact_command_cleans_metadata_and_event_args_and_analyses_the_same(tmp_path):
    """Was: a secret inside a command line, a header or a URL leaked, and traceEvents args passed through."""
    from tracebuilder import TraceBuilder

    b = TraceBuilder()
    b.top["env"] = {"HF_TOKEN": "plain-looking-value", "PATH": "/usr/bin"}
    b.top["command"] = "torchrun train.py --hf_token hf_abcdefghijklmnopqrstuvwxyz0123"
    for i in range(3):
        b.step(i, i * 1000, 1000).kernel(i * 1000, 600, launch_at=i * 1000 - 10)
    b.op("aten::copy_", 10, 5, **{"Concrete Inputs": ["postgresql://u:s3cret@db/x", f"Bearer {JWT}"]})
    src = b.write(tmp_path / "t.json")
    out = tmp_path / "clean.json.gz"
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "redact", str(src), "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "4 strings redacted" in proc.stderr
    import gzip

    text = gzip.decompress(out.read_bytes()).decode()
    for secret in ("plain-looking-value", "hf_abcdef", "s3cret", "eyJhbGci"):
        assert secret not in text
    assert "/usr/bin" in text and "Bearer [redacted]" in text
    reports = [json.loads(subprocess.run([sys.executable, "-m", "kinetoscope.cli", "analyze", "--format", "json", str(p)],
                                         capture_output=True, text=True, timeout=60).stdout) for p in (src, out)]
    for r in reports:
        r["source"] = ""
        for rank in r["ranks"]:
            rank["file"] = ""
    assert reports[0] == reports[1]


# --- the app: uploads, cache, messages -------------------------------------------------------------
def test_an_upload_folder_goes_with_its_owner():
    import gc

    from kinetoscope.app.data import UploadDir

    folder = UploadDir()
    (folder.path / "t.json").write_text("{}")
    path = folder.path
    del folder  # the session's state let go of it (the session ended)
    gc.collect()
    assert not path.exists()


def test_a_new_upload_in_a_session_deletes_the_previous_one():
    from streamlit.testing.v1 import AppTest

    good = (ROOT / "sample_traces" / "real" / "h100_tiny_before_fix_trace.json").read_bytes()
    at = AppTest.from_file(str(ROOT / "kinetoscope" / "app" / "main.py"), default_timeout=120)
    at.session_state["source"] = "Upload"
    at.session_state["pending_uploads"] = [("first.json", good)]
    at.run()
    first = at.session_state["upload_dir"].path
    assert first.is_dir() and (first / "first.json").is_file()
    at.session_state["pending_uploads"] = [("second.json", good + b" ")]
    at.run()
    assert not first.exists() and at.session_state["upload_dir"].path.is_dir()


def test_messages_about_an_upload_name_the_file_not_the_server_folder():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "kinetoscope" / "app" / "main.py"), default_timeout=120)
    at.session_state["source"] = "Upload"
    at.session_state["pending_uploads"] = [("broken.json", b'{"traceEvents": [')]
    at.run()
    errors = " ".join(e.value for e in at.error)
    assert "broken.json" in errors and "kinetoscope-upload-" not in errors and "/tmp" not in errors


def test_the_analysis_cache_is_bounded_by_bytes():
    from kinetoscope.analyze.loader import load_trace
    from kinetoscope.analyze.report import build_report
    from kinetoscope.app.data import Analysis, AnalysisCache, analysis_bytes

    trace = load_trace(SAMPLE)
    one = Analysis("a", build_report(trace), trace)
    size = analysis_bytes(one)
    assert size > 2**20  # a 35 MB trace: 76k events in compact columns
    cache = AnalysisCache(max_bytes=int(size * 2.5))
    for key in "abcd":
        cache.put(key, one)
    assert len(cache) == 2 and cache.get("a") is None and cache.get("d") is one
    assert cache.used_bytes() <= size * 2.5


# --- capture: finishing a trace costs the training thread nothing and memory stays bounded ----------
def test_finishing_a_trace_streams_it_off_the_training_thread(tmp_path):
    """Was: the export decoded, re-encoded and gzipped in memory on the training thread (1 GB: a 46 s stall and
    7 GB of extra memory, see BENCHMARKS.md). Now: a splice of the counters into the text, gzipped in chunks
    on the writer's thread."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from capture_finish import make_raw

    raw = tmp_path / "raw.json"
    make_raw(raw, 96 * 2**20)
    out = _python("""
        import gzip, json, sys, time
        from pathlib import Path
        from kinetoscope.capture.output import TraceWriter
        def status(key):
            return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key)) / 1024
        raw, final = Path(sys.argv[1]), Path(sys.argv[2])
        counters = [{"ph": "C", "name": "GPU 0 telemetry", "pid": "GPU 0", "tid": 0, "ts": 1.5 * k,
                     "args": {"gpu_util_pct": 80.0}} for k in range(3)]
        before = status("VmRSS")
        writer = TraceWriter()
        started = time.perf_counter()
        writer.submit(raw, final, extra_events=counters, distributed_info={"rank": 3, "world_size": 8})
        handed_over = time.perf_counter() - started
        writer.close()
        print(json.dumps({"handed_over_s": handed_over, "extra_mb": status("VmHWM") - before,
                          "raw_left": raw.exists()}))
    """, str(raw), str(tmp_path / "final.json.gz"))
    result = json.loads(out)
    assert result["handed_over_s"] < 0.05 and result["extra_mb"] < 48 and not result["raw_left"]
    import gzip

    from kinetoscope.analyze.loader import load_trace

    doc = json.loads(gzip.decompress((tmp_path / "final.json.gz").read_bytes()))
    assert doc["distributedInfo"] == {"rank": 3, "world_size": 8} and doc["traceName"] == "bench"
    assert [e["ts"] for e in doc["traceEvents"][:3]] == [0.0, 1.5, 3.0] and doc["traceEvents"][3]["cat"] == "kernel"
    trace = load_trace(tmp_path / "final.json.gz").ranks[0]
    assert trace.rank == 3 and len(trace.counters) == 3


def test_splicing_into_an_empty_event_list_and_a_document_with_distributed_info(tmp_path):
    from kinetoscope.capture.output import finish_trace

    raw = tmp_path / "raw.json"
    raw.write_text('{"distributedInfo": {"rank": 1}, "traceEvents": [ ]}')
    finish_trace(raw, tmp_path / "t.json.gz", extra_events=[{"ph": "C", "name": "x", "ts": 1, "args": {"v": 1}}],
                 distributed_info={"rank": 9})
    import gzip

    doc = json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))
    assert doc == {"distributedInfo": {"rank": 1}, "traceEvents": [{"ph": "C", "name": "x", "ts": 1, "args": {"v": 1}}]}
