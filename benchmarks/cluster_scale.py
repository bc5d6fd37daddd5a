"""A synthetic N-rank job (default 1,024 ranks, ~17 MB of JSON each) through ``kinetoscope batch`` on a local Dask
cluster, as a platform team would run it: ranks per minute, peak memory of every worker process, and what the
job-level reduce found (the straggler, its cause, every rank's clock skew) against the planted truth.

    python benchmarks/cluster_scale.py [--ranks 1024] [--workers 2] [--dir /tmp/kinetoscope-cluster] [--keep]

The job is generated on the fly (benchmarks/cluster_job.py) and deleted afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_job import write_job  # noqa: E402


class TreeMemory:
    """Peak RSS of every process under ``pid`` (the batch command, its Dask scheduler and workers), sampled."""

    def __init__(self, pid: int, period_s: float = 0.2) -> None:
        self.root = psutil.Process(pid)
        self.peak: dict[int, tuple[str, int]] = {}
        self.samples: list[tuple[float, int, int]] = []  # (time, the largest worker's RSS, the driver's RSS)
        self._stop = threading.Event()
        self._period = period_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.perf_counter()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root] + self.root.children(recursive=True)
            except psutil.Error:
                return
            total = 0
            largest = 0
            driver = 0
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    cmd = " ".join(p.cmdline())
                except psutil.Error:
                    continue
                role = "driver" if p.pid == self.root.pid else "worker" if "spawn_main" in cmd else "other"
                if role == "worker":
                    total += rss
                    largest = max(largest, rss)
                if role == "driver":
                    driver = rss
                name, old = self.peak.get(p.pid, (role, 0))
                self.peak[p.pid] = (role, max(old, rss))
            self.samples.append((time.perf_counter() - self._started, largest, driver))
            self._stop.wait(self._period)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--kernels", type=int, default=150)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/kinetoscope-cluster"))
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    job = args.dir / f"job-{args.ranks}"
    store = args.dir / f"store-{args.ranks}"
    shutil.rmtree(store, ignore_errors=True)
    truth_path = args.dir / f"job-{args.ranks}.truth"
    try:
        return run(args, job, store, truth_path)
    finally:  # tens of GB: removed on failure too
        if not args.keep:
            shutil.rmtree(job, ignore_errors=True)
            truth_path.unlink(missing_ok=True)
            shutil.rmtree(store, ignore_errors=True)


def run(args: argparse.Namespace, job: Path, store: Path, truth_path: Path) -> int:
    """Generate the job (unless kept from a run with --keep), batch it, and check what the store holds against
    the planted truth: 0 when the straggler, its cause and every skew were found, 1 otherwise."""
    if not truth_path.exists():
        t0 = time.perf_counter()
        size = write_job(job, args.ranks, args.steps, args.kernels)
        print(f"generated {args.ranks} ranks, {size / 1e9:,.2f} GB of JSON in {time.perf_counter() - t0:.0f} s")
    truth = json.loads(truth_path.read_text())
    size = sum(p.stat().st_size for p in job.glob("rank-*.json"))
    print(f"job: {args.ranks} ranks, {size / 1e9:,.2f} GB of JSON ({size / args.ranks / 1e6:.1f} MB per rank)")

    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "kinetoscope", "batch", str(job), "--store", str(store),
                             "--workers", str(args.workers)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    mem = TreeMemory(proc.pid)
    out, _ = proc.communicate()
    mem.stop()
    wall = time.perf_counter() - started
    tail = out.strip().splitlines()[-3:]
    if tail:
        print("\n".join(tail))
    if proc.returncode != 0:
        print(f"kinetoscope batch exited {proc.returncode}: no numbers")
        return 1
    print(f"batch: {wall:.0f} s wall, {args.ranks / wall * 60:,.0f} ranks per minute, "
          f"{size / wall / 1e6:,.0f} MB of JSON per second, {args.workers} workers")
    peaks = sorted(((role, rss) for role, rss in mem.peak.values()), key=lambda x: (x[0], -x[1]))
    for role, rss in peaks:
        if role in ("driver", "worker"):
            print(f"  peak RSS {role}: {rss / 2**20:,.0f} MiB")
    tenth = max(len(mem.samples) // 10, 1)
    curve = [(max(x[1] for x in mem.samples[i:i + tenth]), max(x[2] for x in mem.samples[i:i + tenth]))
             for i in range(0, len(mem.samples), tenth)]
    print("  largest worker's RSS per tenth of the run (MiB): " + " ".join(f"{w / 2**20:.0f}" for w, _ in curve))
    print("  driver's RSS per tenth of the run (MiB): " + " ".join(f"{d / 2**20:.0f}" for _, d in curve))
    quarter = len(mem.samples) // 4
    if quarter:  # the first quarter holds the workers' start; the second and the last are steady work
        second = max(s[1] for s in mem.samples[quarter:2 * quarter])
        last = max(s[1] for s in mem.samples[-quarter:])
        print(f"  largest worker's RSS: {second / 2**20:,.0f} MiB at most in the second quarter of the run, "
              f"{last / 2**20:,.0f} MiB in the last (flat: memory does not grow with the ranks done)")

    import duckdb

    con = duckdb.connect()
    q = lambda sql: con.execute(sql.replace("STORE", str(store))).fetchall()  # noqa: E731
    try:
        (ok, failed) = q("SELECT count(*) FILTER (status = 'ok'), count(*) FILTER (status <> 'ok') "
                         "FROM read_parquet('STORE/traces/*.parquet')")[0]
        jobs = q("SELECT straggler_rank, straggler_cause, straggler_wait_us_per_step, matched, unmatched, "
                 "max_abs_clock_skew_us, reduce_s FROM read_parquet('STORE/jobs/*.parquet')")
        ranks = q("SELECT rank, clock_skew_us, wait_us, waited_for_rank FROM read_parquet('STORE/job_ranks/*.parquet') "
                  "ORDER BY rank")
    except duckdb.Error as exc:  # a table the batch did not write: no numbers to check
        print(f"the store lacks a table the job-level reduce writes ({str(exc).splitlines()[0]})\nverdict: MISSED")
        return 1
    print(f"store (read with DuckDB): {ok} ranks ok, {failed} failed; jobs row: {jobs}")
    ref = truth["skew_us"][str(ranks[0][0])] if ranks else 0.0
    # a skew the reduce could not measure (null) is a miss, never an error of 0
    errors = [abs(skew - (truth["skew_us"][str(r)] - ref)) if skew is not None else float("inf")
              for r, skew, _, _ in ranks]
    worst = max(errors, default=float("inf"))
    waited = {w for _, _, _, w in ranks if w is not None}
    print(f"planted: straggler rank {truth['straggler']} ({truth['cause']}, "
          f"{truth['late_us']:.0f} us late every step); clock skews within +-1.02 ms")
    if jobs:
        srank, cause, wait_us, matched, unmatched, max_skew, reduce_s = jobs[0]
        print(f"found:   straggler rank {srank} ({cause}), the others wait {wait_us:.1f} us per step for it; "
              f"{matched} collectives matched, {unmatched} unmatched; ranks waited for: {sorted(waited)}")
        print(f"         clock skews: {len(errors)} ranks, largest error {worst:.3f} us "
              f"(largest skew {max_skew:,.0f} us); reduce over {len(ranks)} summaries in {reduce_s:.2f} s")
    found = bool(jobs) and jobs[0][0] == truth["straggler"] and jobs[0][1] == truth["cause"]
    exact = len(errors) == args.ranks and failed == 0 and worst < 1.0
    print(f"verdict: straggler and cause {'found' if found else 'MISSED'}; skews "
          f"{'all within 1 us' if exact else 'MISSED (a rank missing, failed, unmeasured or off by 1 us or more)'}")
    return 0 if found and exact else 1


if __name__ == "__main__":
    sys.exit(main())
