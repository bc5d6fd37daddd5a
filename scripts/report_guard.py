#!/usr/bin/env python3
"""Write the report of every trace and job we hold, one file per input, and compare two such folders.

A guard for moves that must not change behaviour: run it before (``report_guard.py write OUT_BEFORE``) and after
(``report_guard.py write OUT_AFTER``), then ``report_guard.py --compare OUT_BEFORE OUT_AFTER`` says which inputs'
outputs differ byte for byte. Each report goes through the ``kinetoscope`` command's own entry
(``kinetoscope.cli.main``), the same path ``kinetoscope analyze --format json`` takes, so what is compared is what a
user sees: the JSON report, the text report, and (for a few inputs) ``diff`` and ``whatif``.

Inputs: every trace file and every directory of traces (a capture, a multi-rank job) under ``sample_traces/`` and
under the shared traces folder (``--shared``, default ``../shared/traces`` beside the main checkout), and the traces
the tests' expert readings (``tests/expert/*.toml``) name that exist on disk. Files larger than ``--max-mb``
(gunzipped size is not known up front: the size on disk) are skipped and listed in ``SKIPPED.txt``.
Run it from the repository root: paths in the reports are written as given (relative to the root, or absolute for
the shared traces), so two checkouts compare equal.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import sys
import time
import tomllib
from pathlib import Path

TRACE_SUFFIXES = (".json", ".json.gz")
SIDECAR_SUFFIXES = (".manifest.json", ".steps.json")


def _is_trace(p: Path) -> bool:
    name = p.name.lower()
    return p.is_file() and name.endswith(TRACE_SUFFIXES) and not name.endswith(SIDECAR_SUFFIXES) \
        and not name.startswith(".")


def _inputs(root: Path, shared: Path | None, max_mb: float) -> tuple[list[str], list[str]]:
    """(inputs as the command is given them, skipped inputs with the reason)."""
    found: list[str] = []
    skipped: list[str] = []

    def add(path: Path, shown: str) -> None:
        if path.is_file() and path.stat().st_size > max_mb * 1e6:
            skipped.append(f"{shown}\t{path.stat().st_size / 1e6:.0f} MB on disk (over --max-mb {max_mb})")
        elif shown not in found:
            found.append(shown)

    def walk(base: Path, shown_base: str) -> None:
        for d in sorted([base, *(p for p in base.rglob("*") if p.is_dir())]):
            traces = sorted(p for p in d.iterdir() if _is_trace(p))
            rel = d.relative_to(base)
            shown_dir = shown_base if str(rel) == "." else f"{shown_base}/{rel}"
            for t in traces:
                add(t, f"{shown_dir}/{t.name}")
            # a directory of traces is a job (a capture, a multi-rank job), as `analyze DIR` takes it
            if traces and (len(traces) > 1 or any(p.name.endswith(SIDECAR_SUFFIXES) for p in d.iterdir())):
                add(d, shown_dir)

    walk(root / "sample_traces", "sample_traces")
    if shared is not None and shared.is_dir():
        walk(shared, str(shared))
    for toml in sorted((root / "tests" / "expert").glob("*.toml")):
        doc = tomllib.loads(toml.read_text())
        for key in ("trace", "copy"):
            name = doc.get(key)
            if not name:
                continue
            # '../shared/...' in a reading is relative to the main checkout; a worktree has it at --shared
            if shared is not None and name.startswith("../shared/traces/"):
                path, shown = shared / name[len("../shared/traces/"):], str(shared / name[len("../shared/traces/"):])
            else:
                path, shown = root / name, name
            if path.exists():
                add(path, shown)
            else:
                skipped.append(f"{shown}\tnamed by tests/expert/{toml.name}, not on disk")
    return found, skipped


def _run(argv: list[str]) -> tuple[int, str, str]:
    from kinetoscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _name(shown: str) -> str:
    safe = shown.strip("/").replace("/", "__")
    return safe if len(safe) < 180 else safe[:150] + "-" + hashlib.sha1(shown.encode()).hexdigest()[:12]


PAIRS = [  # (before, after) for `kinetoscope diff`
    ("sample_traces/pairs/v100_resnet50_num_workers_0_run2.json.gz",
     "sample_traces/pairs/v100_resnet50_num_workers_4.json.gz"),
    ("sample_traces/cpu/healthy", "sample_traces/cpu/loader_bound"),
]
WHATIF = [  # (path, extra arguments) for `kinetoscope whatif --format json`
    ("sample_traces/cpu/loader_bound", []),
    ("sample_traces/cpu/item_every_step", []),
    ("sample_traces/cpu/loader_bound", ["--fix", "loader_stall", "--set", "loader_stall.num_workers=4"]),
    ("sample_traces/pairs/v100_resnet50_num_workers_0_run2.json.gz", []),
    ("sample_traces/captures/ddp_straggler", []),
    ("sample_traces/captures/profiler_api_loader", []),
]


def write(out: Path, root: Path, shared: Path | None, max_mb: float, text: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    inputs, skipped = _inputs(root, shared, max_mb)
    (out / "INPUTS.txt").write_text("".join(f"{i}\n" for i in inputs))
    (out / "SKIPPED.txt").write_text("".join(f"{s}\n" for s in skipped))
    t0 = time.perf_counter()
    for n, shown in enumerate(inputs, 1):
        t = time.perf_counter()
        code, stdout, stderr = _run(["analyze", "--format", "json", shown])
        (out / f"{_name(shown)}.json.out").write_text(f"exit {code}\n{stderr}---\n{stdout}")
        if text:
            code, stdout, stderr = _run(["analyze", shown])
            (out / f"{_name(shown)}.text.out").write_text(f"exit {code}\n{stderr}---\n{stdout}")
        print(f"[{n}/{len(inputs)}] {time.perf_counter() - t:5.1f} s  {shown}", file=sys.stderr)
    for before, after in PAIRS:
        for fmt in ("json", "text"):
            code, stdout, stderr = _run(["diff", "--format", fmt, before, after])
            (out / f"diff__{_name(before)}__{_name(after)}.{fmt}.out").write_text(f"exit {code}\n{stderr}---\n{stdout}")
    for path, extra in WHATIF:
        for fmt in ("json", "text"):
            code, stdout, stderr = _run(["whatif", "--format", fmt, path, *extra])
            tag = _name(path) + ("__" + "_".join(extra).replace("=", "-") if extra else "")
            (out / f"whatif__{tag}.{fmt}.out").write_text(f"exit {code}\n{stderr}---\n{stdout}")
    print(f"{len(inputs)} inputs, {len(skipped)} skipped, {len(PAIRS)} diffs, {len(WHATIF)} whatifs "
          f"in {time.perf_counter() - t0:.0f} s -> {out}", file=sys.stderr)
    return 0


def compare(a: Path, b: Path) -> int:
    names_a = {p.name for p in a.iterdir() if p.is_file()}
    names_b = {p.name for p in b.iterdir() if p.is_file()}
    same, differ = [], []
    for name in sorted(names_a & names_b):
        (same if (a / name).read_bytes() == (b / name).read_bytes() else differ).append(name)
    only_a, only_b = sorted(names_a - names_b), sorted(names_b - names_a)
    for name in differ:
        print(f"DIFFERS  {name}")
    for name in only_a:
        print(f"ONLY IN {a}: {name}")
    for name in only_b:
        print(f"ONLY IN {b}: {name}")
    print(f"{len(same)} identical, {len(differ)} differ, {len(only_a)} only in {a}, {len(only_b)} only in {b}")
    return 0 if not (differ or only_a or only_b) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", nargs=2, metavar=("DIR_A", "DIR_B"), help="say which outputs differ")
    parser.add_argument("out", nargs="?", help="folder to write the outputs into (one file per input)")
    parser.add_argument("--shared", default=None, help="the shared traces folder (default: ../shared/traces beside "
                        "the main checkout, i.e. /work/shared/traces when it exists)")
    parser.add_argument("--max-mb", type=float, default=150.0, help="skip trace files larger than this on disk")
    parser.add_argument("--no-text", action="store_true", help="only the JSON reports")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(Path(args.compare[0]), Path(args.compare[1]))
    if not args.out:
        parser.error("name an output folder, or --compare DIR_A DIR_B")
    root = Path.cwd()
    shared = Path(args.shared) if args.shared else next(
        (p for p in (root.parent / "shared" / "traces", root.parent.parent / "shared" / "traces") if p.is_dir()), None)
    return write(Path(args.out), root, shared, args.max_mb, not args.no_text)


if __name__ == "__main__":
    sys.exit(main())
