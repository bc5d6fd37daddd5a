"""A multi-rank job analysed as a user times it, Kinetoscope beside HolisticTraceAnalysis: whole processes, wall time
and peak RSS against the job's size on disk.

    python benchmarks/multirank_vs_hta.py [--ranks 8] [--steps 150] [--kernels 150] [--no-hta]

The job is benchmarks/cluster_job.py's (planted skews and straggler), generated in a temporary folder.
Kinetoscope: ``kinetoscope analyze DIR`` (every rank, the job-level collectives and straggler, the what-if).
HTA: ``TraceAnalysis(trace_dir=DIR)`` (its parse of every rank) then its multi-rank analyses, temporal breakdown
and communication/computation overlap (it has no straggler or clock-skew analysis).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_job import write_job  # noqa: E402

HTA = """
import logging, sys, time
logging.disable(logging.CRITICAL)
t = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
a.get_comm_comp_overlap(visualize=False)
print(f"{time.perf_counter() - t:.2f}")
"""


def timed(cmd: list[str]) -> tuple[float, int, str]:
    """Wall seconds, the peak of the summed RSS of the process and all its children (HTA parses ranks in a pool of
    processes), sampled every 50 ms; its output."""
    import psutil

    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    out: list[str] = []
    reader = __import__("threading").Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    while proc.poll() is None:
        total = 0
        try:
            for p in [root] + root.children(recursive=True):
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        peak = max(peak, total)
        time.sleep(0.05)
    wall = time.perf_counter() - t
    reader.join()
    if proc.returncode not in (0, 3):
        raise RuntimeError("".join(out)[-1500:])
    return wall, peak, "".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--kernels", type=int, default=150)
    ap.add_argument("--no-hta", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job"
        size = write_job(job, args.ranks, args.steps, args.kernels)
        print(f"{args.ranks} ranks, {size / 1e6:,.0f} MB of JSON ({size / args.ranks / 1e6:.1f} MB per rank)")
        wall, rss, out = timed([sys.executable, "-m", "kinetoscope", "analyze", str(job)])
        pwall, prss, _ = timed([sys.executable, "-m", "kinetoscope", "analyze", "--processes", "2", str(job)])
        straggler = next((line.strip() for line in out.splitlines() if "straggler" in line.lower()), "")
        print(f"kinetoscope analyze: {wall:.2f} s, peak RSS (all processes) {rss / 2**20:,.0f} MiB "
              f"= {rss / size:.2f}x the JSON; {straggler[:110]}")
        print(f"kinetoscope analyze --processes 2: {pwall:.2f} s, peak RSS (all processes) {prss / 2**20:,.0f} MiB = "
              f"{prss / size:.2f}x the JSON")
        if not args.no_hta:
            hwall, hrss, hout = timed([sys.executable, "-c", HTA, str(job)])
            print(f"HTA (parse + temporal breakdown + comm/comp overlap): {hwall:.2f} s, peak RSS (all processes) "
                  f"{hrss / 2**20:,.0f} MiB = {hrss / size:.2f}x the JSON; "
                  f"kinetoscope {hwall / wall:.1f}x faster in one process ({hwall / pwall:.1f}x with --processes 2), "
                  f"{hrss / rss:.1f}x less memory")


if __name__ == "__main__":
    main()
