"""The command line as a user meets it: reports, one-line errors, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tracebuilder import TraceBuilder

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kinetoscope.cli", *args], capture_output=True, text=True, timeout=300)


def test_help_documents_every_command():
    out = run("--help").stdout
    for command in ("analyze", "app", "capture"):
        assert command in out
    assert "--format" in run("analyze", "--help").stdout


def test_text_report_lists_findings_then_ranks():
    proc = run("analyze", str(SAMPLES / "real" / "v100_resnet50_2021.json.gz"))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.index("Findings") < text.index("Rank 0")
    assert "loader_stall" in text and "WARNING" in text  # an upper bound (host cores not recorded): a warning


def test_json_report_is_one_object_per_job_with_the_documented_keys():
    proc = run("analyze", "--format", "json", str(SAMPLES / "real" / "hta_2rank"), str(SAMPLES / "cpu" / "leak"))
    assert proc.returncode == 0, proc.stderr
    reports = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(reports) == 2
    two_rank = reports[0]
    assert two_rank["schema_version"] == 1
    assert [r["rank"] for r in two_rank["ranks"]] == [0, 1]
    rank = two_rank["ranks"][0]
    for key in ("window_us", "steps", "loader", "gpu", "h2d", "memory"):
        assert key in rank
    assert set(rank["steps"]) >= {"count", "mean_us"}
    assert set(rank["gpu"]) >= {"idle_fraction", "streams"}
    assert set(rank["gpu"]["streams"][0]) >= {"device", "stream", "idle_fraction"}
    assert set(rank["h2d"]) >= {"time_us", "bytes", "overlap_fraction", "pageable_fraction"}
    assert rank["memory"] is None  # no memory events in this trace
    assert set(rank["loader"]) >= {"time_us", "fraction", "gpu_idle_cost_us"}
    leak = reports[1]
    (finding,) = [f for f in leak["findings"] if f["id"] == "memory_growth"]
    assert set(finding) >= {"id", "severity", "rank", "title", "evidence", "recommendation"}


def test_bad_input_is_one_line_on_stderr_and_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ nope")
    proc = run("analyze", str(bad))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("kinetoscope: error:")


def test_a_device_file_is_bad_input_not_an_internal_error():
    proc = run("analyze", "/dev/null")
    assert proc.returncode == 2 and "not a regular file or a directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_one_broken_file_does_not_lose_the_others(tmp_path):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    good = TraceBuilder().step(1, 0, 100).kernel(0, 50).write(tmp_path / "good.json")
    proc = run("analyze", "--format", "json", str(bad), str(good), str(tmp_path / "missing.json"))
    assert proc.returncode == 2
    assert len(proc.stdout.splitlines()) == 1 and json.loads(proc.stdout)["ranks"][0]["window_us"] == 100
    assert len(proc.stderr.strip().splitlines()) == 2 and "Traceback" not in proc.stderr


def test_no_command_prints_help_and_exits_2():
    proc = run()
    assert proc.returncode == 2 and "analyze" in proc.stdout


def test_capture_directory_with_several_windows_gives_one_report_each(tmp_path):
    for window in ("step-2-3", "step-7-8"):
        TraceBuilder().step(1, 0, 100).write(tmp_path / f"rank-0.{window}.pt.trace.json.gz")
    proc = run("analyze", "--format", "json", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    sources = [json.loads(line)["source"] for line in proc.stdout.splitlines()]
    assert [s.rsplit("(", 1)[1] for s in sources] == ["steps 2-3)", "steps 7-8)"]


def test_cli_start_up_stays_light():
    """Building the parser (every --help, every capture) must not load pandas, pyarrow, Dask or torch."""
    code = ("import sys, kinetoscope.cli as c; c.build_parser(); "
            "heavy = [m for m in ('pandas', 'pyarrow', 'dask', 'torch') if m in sys.modules]; print(heavy); "
            "sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_analyze_starts_reading_before_the_analyses_are_imported():
    """What `kinetoscope analyze` imports before its first file's scan starts (``scan.Ahead``): no numpy, no
    pandas, nothing of the capture side; those imports then run beside the scan."""
    code = ("import sys, kinetoscope.cli, kinetoscope.analyze.ingest.jobs, kinetoscope.analyze.ingest.scan\n"
            "print(sorted(m for m in ('numpy', 'pandas', 'pyarrow', 'torch', 'kinetoscope.capture.profiler',"
            " 'kinetoscope.capture.output', 'kinetoscope.analyze.ingest.raw') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _pandas_major() -> int:
    import pandas as pd

    return int(pd.__version__.split(".")[0])


def test_the_installed_pandas_version_is_read_without_importing_it():
    from kinetoscope.cli.process import _pandas_major as read

    assert read() == _pandas_major()


@pytest.mark.slow
@pytest.mark.skipif(_pandas_major() < 3, reason="pandas 2's pyarrow hooks break when it is blocked: not done there")
def test_pandas_without_pyarrow_until_something_asks_for_it():
    """The analysing commands' own processes import pandas as an install without the optional pyarrow would; pyarrow
    itself still imports afterwards, and a process that already has pandas keeps it as it is."""
    pytest.importorskip("pyarrow")
    code = ("import sys\n"
            "from kinetoscope.cli.process import import_pandas_without_pyarrow\n"
            "print(import_pandas_without_pyarrow())\n"
            "import pandas as pd\n"
            "print('pyarrow' in sys.modules, pd.Series(['a']).dtype.storage)\n"
            "import pyarrow\n"
            "print(pyarrow.array([1]).to_pylist())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False", "python", "[1]"]
    code = ("import sys, pandas as pd\n"
            "from kinetoscope.cli.process import import_pandas_without_pyarrow\n"
            "print(import_pandas_without_pyarrow(), pd.Series(['a']).dtype.storage)\n")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.split() == ["False", "pyarrow"]


@pytest.mark.slow
def test_cli_main_called_as_a_library_leaves_pandas_and_pyarrow_alone():
    """``kinetoscope.cli.main`` runs in someone else's process: pandas keeps its pyarrow there (Arrow dtypes work
    after an analyze, a diff and a whatif)."""
    pytest.importorskip("pyarrow")
    pairs = SAMPLES / "pairs"
    before, after = (str(pairs / f"v100_resnet50_profiler_api_num_workers_{n}.json.gz") for n in (0, 4))
    code = ("import io, contextlib, sys\n"
            "import kinetoscope.cli as c\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    codes = [c.main(['analyze', sys.argv[1]]), c.main(['diff', sys.argv[1], sys.argv[2]]),\n"
            "             c.main(['whatif', sys.argv[1], '--fix', 'loader_stall'])]\n"
            "import pandas as pd, pyarrow as pa\n"
            "print(codes, pd.Series([1], dtype=pd.ArrowDtype(pa.int64())).dtype,"
            " pd.array(['a'], dtype='string[pyarrow]').dtype)\n")
    out = subprocess.run([sys.executable, "-c", code, before, after], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[0,", "0,", "0]", "int64[pyarrow]", "string"]


@pytest.mark.slow
@pytest.mark.skipif(_pandas_major() < 3, reason="pandas 2's pyarrow hooks break when it is blocked: not done there")
def test_analyze_never_imports_pyarrow_and_reports_as_with_it():
    """`kinetoscope analyze` (no --cache, no --processes) runs without pyarrow: the report is byte for byte the
    one this process, whose pandas has pyarrow, builds."""
    pytest.importorskip("pyarrow")
    from kinetoscope.analyze.ingest.loader import load_trace
    from kinetoscope.analyze.report.builder import build_report
    from kinetoscope.render.json import report_to_json

    path = SAMPLES / "real" / "hta_2rank"
    # the command ends with os._exit: the check runs there, just before it
    code = ("import os, sys\n"
            "exit_ = os._exit\n"
            "def _exit(code):\n"
            "    sys.stderr.write('pyarrow loaded: %s\\n' % (sys.modules.get('pyarrow') is not None))\n"
            "    sys.stderr.flush()\n"
            "    exit_(code)\n"
            "os._exit = _exit\n"
            "sys.argv = ['kinetoscope', 'analyze', '--format', 'json', sys.argv[1]]\n"
            "from kinetoscope.cli import run\n"
            "run()\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "pyarrow loaded: False" in proc.stderr
    import pandas as pd

    assert pd.Series(["a"]).dtype.storage == "pyarrow"  # this process: the other string storage
    assert proc.stdout == report_to_json(build_report(load_trace(path))) + "\n"


@pytest.mark.slow
def test_a_quick_exit_still_delivers_every_byte_and_the_status():
    """analyze ends its process with os._exit once its output is flushed: a pipe gets the whole report, and
    the exit status is the command's."""
    proc = run("analyze", "--format", "json", "--fail-on", "warning", str(SAMPLES / "cpu" / "loader_bound"),
               str(SAMPLES / "real" / "v100_resnet50_2021.json.gz"))
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(reports) == 2 and reports[1]["ranks"][0]["steps"]["count"] > 0
    assert proc.returncode == 3 and "--fail-on warning" in proc.stderr
    app = subprocess.run([sys.executable, "-m", "kinetoscope", "app", "--help"], capture_output=True, text=True)
    assert app.returncode == 0 and "usage" in app.stdout  # commands that do not opt in exit as usual


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_that_cannot_be_written_is_an_error_not_a_silent_success():
    """A full disk under a small report (it fits the buffer, so only the final flush fails)."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "kinetoscope", "analyze", "--format", "json",
                               str(SAMPLES / "cpu" / "leak")], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=300, env={**os.environ, "PYTHONUNBUFFERED": ""})
    assert proc.returncode == 2
    assert proc.stderr == "kinetoscope: error: cannot write the output (No space left on device)\n"


def test_a_closed_stdout_gives_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "kinetoscope", "analyze", str(SAMPLES / "cpu" / "leak")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300,
                          preexec_fn=lambda: os.close(1))
    assert proc.returncode == 2
    assert proc.stderr == "kinetoscope: error: cannot write the output (standard output is closed)\n"


def test_analyze_scans_its_first_file_ahead_and_uses_that_scan(monkeypatch, capsys):
    from kinetoscope import cli
    from kinetoscope.analyze.ingest import scan

    made, used = [], []

    class Spy(scan.Ahead):
        def __init__(self, path, limits):
            made.append(path)
            super().__init__(path, limits)

        def result(self):
            used.append(self.path)
            return super().result()

    calls = []
    real_scan = scan.scan_file
    monkeypatch.setattr(scan, "Ahead", Spy)
    monkeypatch.setattr(scan, "scan_file", lambda path, limits=None: calls.append(path) or real_scan(path, limits))
    folder = SAMPLES / "real" / "hta_2rank"
    assert cli.main(["analyze", str(folder)]) == 0
    files = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
    assert made == [files[0]] and used == [files[0]]
    assert sorted(calls) == files  # each file scanned once: the first by the Ahead, the second by the loader
    assert "Kinetoscope report" in capsys.readouterr().out


@pytest.mark.slow
def test_diff_prints_the_same_table_whatever_the_hash_seed():
    """Findings gone, new and still there are listed in the reports' order (most severe first), not a set's."""
    pairs = SAMPLES / "pairs"
    before = pairs / "v100_resnet50_num_workers_0_run2.json.gz"
    after = pairs / "v100_resnet50_num_workers_4_run2.json.gz"
    outs = {subprocess.run([sys.executable, "-m", "kinetoscope", "diff", str(before), str(after)],
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3", "4")}
    assert len(outs) == 1 and "still there" in outs.pop()
