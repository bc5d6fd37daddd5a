"""A trace larger than the memory it is analysed in (a benchmark, not a test).

Writes a multi-GB trace by streaming (the real H100 OWLv2 trace's events, replicated and shifted in
time, in its indented layout; the writer never holds more than one copy), then runs
``kinetoscope analyze --format json`` on it inside a memory cgroup whose limit is below the size of
the JSON (Linux, root, cgroup v1 or v2; without one it runs unconstrained and says so) and reports
the time, the throughput and the process's peak RSS.

Run: python benchmarks/streaming.py [--gb 2.5] [--limit-mb 1536] [--keep PATH (reused when it exists)]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replicas import load_events, shifted_copy

ROOT = Path(__file__).resolve().parents[1]
SOURCE = (ROOT.parent / "shared" / "traces" / "TraceLens/tests/traces/h100"
          / "google_owlv2-large-patch14-ensemble__1016001.json.gz")

CHILD = """
import sys, time, io, contextlib
from kinetoscope.cli import main
t = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["analyze", sys.argv[1], "--format", "json"])
peak = int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024
print(code, time.perf_counter() - t, peak)
"""


def write_trace(source: Path, out: Path, target_bytes: int) -> tuple[int, int]:
    """Stream copies of source's events into out until it reaches target_bytes; (bytes, events)."""
    doc, events, span = load_events(source)
    del doc["traceEvents"]  # written last, one copy at a time
    head = json.dumps(doc, indent=2)[:-2]  # without the closing "\n}"
    written = n = 0
    with open(out, "w") as fh:
        fh.write(head + ',\n  "traceEvents": [\n')
        i = 0
        first = True
        while written < target_bytes:
            parts = ["    " + json.dumps(c, indent=2).replace("\n", "\n    ") for c in shifted_copy(events, i, span)]
            n += len(parts)
            chunk = ("" if first else ",\n") + ",\n".join(parts)
            first = False
            fh.write(chunk)
            written += len(chunk)
            i += 1
        fh.write("\n  ]\n}\n")
    return out.stat().st_size, n


def _cgroup(limit: int) -> tuple[Path | None, str]:
    """A memory cgroup limited to ``limit`` bytes, if this machine lets us make one."""
    name = f"kinetoscope-bench-{os.getpid()}"
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    try:
        if v2.exists():
            group = Path("/sys/fs/cgroup") / name
            group.mkdir()
            (group / "memory.max").write_text(str(limit))
            (group / "memory.swap.max").write_text("0")
            return group, "cgroup v2"
        group = Path("/sys/fs/cgroup/memory") / name
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit))
        swap = group / "memory.memsw.limit_in_bytes"
        if swap.exists():
            swap.write_text(str(limit))
        return group, "cgroup v1"
    except OSError:
        return None, "no cgroup (not root?): unconstrained"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.5, help="size of the trace to write (GB of JSON)")
    ap.add_argument("--limit-mb", type=int, default=1536, help="memory limit for the analysis")
    ap.add_argument("--keep", type=Path, help="write the trace here and keep it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "rank-0.json"
        if args.keep and args.keep.exists():  # reuse a trace written before
            size, n = path.stat().st_size, sum(1 for line in open(path, "rb") if line.startswith(b'      "ph"'))
        else:
            t = time.perf_counter()
            size, n = write_trace(SOURCE, path, int(args.gb * 1e9))
            print(f"wrote {size / 1e9:.2f} GB, {n:,} events in {time.perf_counter() - t:.0f} s")
        limit = args.limit_mb * 2**20
        group, how = _cgroup(limit)

        def enter() -> None:
            if group is not None:
                (group / "cgroup.procs").write_text(str(os.getpid()))

        try:
            proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True,
                                  preexec_fn=enter, timeout=3600)
        finally:
            if group is not None:
                for _ in range(50):
                    try:
                        group.rmdir()
                        break
                    except OSError:
                        time.sleep(0.1)
        if proc.returncode != 0:
            print(f"failed (exit {proc.returncode}; killed for memory if -9): {proc.stderr[-400:]}")
            return
        code, seconds, peak = proc.stdout.split()[-3:]
        seconds_f, peak_i = float(seconds), int(peak)
        print(f"| JSON | events | memory limit ({how}) | exit | seconds | MB/s | peak RSS | peak RSS / JSON |")
        print("|---|---|---|---|---|---|---|---|")
        print(f"| {size / 1e9:.2f} GB | {n / 1e6:.1f} M | {limit / 2**30:.2f} GiB | {code} | {seconds_f:.1f} | "
              f"{size / 1e6 / seconds_f:.0f} | {peak_i / 2**30:.2f} GiB | {peak_i / size:.2f}x |")


if __name__ == "__main__":
    main()
