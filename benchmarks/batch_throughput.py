"""Batch throughput per Dask worker against one ``kinetoscope analyze`` process, in the same run, on a real cluster
started as users start it (``dask scheduler``, ``dask worker`` with its nanny, ``kinetoscope batch --scheduler``).

    python benchmarks/batch_throughput.py [--ranks 64] [--workers 2] [--repeats 3] [--dir /tmp/kinetoscope-tput]

The job is the synthetic N-rank job of benchmarks/cluster_job.py (17.4 MB of JSON per rank at the defaults),
generated once into --dir and deleted afterwards unless --keep. Each repeat runs, back to back:

  single   ``kinetoscope analyze --format json`` over every rank file in one process (its speed: MB/s of JSON)
  dask     a scheduler and ``--workers`` worker processes (``dask worker --nworkers N --nthreads 1``) as Dask
           starts them by default (its nanny sets MALLOC_TRIM_THRESHOLD_=65536), then ``kinetoscope batch``
  fixed    as deploy/README.md starts them: MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_ at 32 MiB in the
           workers' environment and ``--preload kinetoscope.batch.task`` (the analyzers imported at the worker's start)
  tuned    as fixed, and Dask's upkeep slowed down as deploy/README.md now starts the workers (``WORKER_ENV``: the
           event loop's 20 ms tick at 1 s, the system monitor at 5 s, the memory monitor at 1 s)
  local    ``kinetoscope batch --workers N`` (its own LocalCluster, which sets the same; its start is timed)

and prints, per cluster run: ranks per minute, MB/s in all and per worker, the per-worker speed as a fraction of
the single process's in the same repeat (machine load slows both), the CPU seconds per rank of the workers and of
the single process (their ratio is the per-worker speed at equal CPU: on a shared machine with autogroup scheduling
a session's processes share one slice of the CPU, so the wall ratio of 2 workers cannot exceed ~0.5 while other
sessions are busy), and each worker's peak RSS (sampled every 0.1 s). The cluster's start is not timed (a
platform's cluster is up before a batch); the batch's own start, discovery, reduce and summary are.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_job import write_job  # noqa: E402

from kinetoscope.batch.run import MALLOC_ENV, WORKER_ENV  # noqa: E402

PY = sys.executable


class Sampler:
    """Peak RSS and CPU seconds of a set of processes (found again on every sample: workers may restart)."""

    def __init__(self, find, period_s: float = 0.1) -> None:  # find() -> list[psutil.Process]
        self.find = find
        self.peak: dict[int, int] = {}
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._period = period_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self._period)

    def sample(self) -> None:
        for p in self.find():
            try:
                rss = p.memory_info().rss
                t = p.cpu_times()
            except psutil.Error:
                continue
            self.peak[p.pid] = max(self.peak.get(p.pid, 0), rss)
            self.cpu[p.pid] = t.user + t.system

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def run_single(files: list[Path]) -> dict[str, float]:
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen([PY, "-m", "kinetoscope", "analyze", "--format", "json", *map(str, files)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    handle = psutil.Process(proc.pid)
    sampler = Sampler(lambda: [handle])
    _, err = proc.communicate()
    wall = time.perf_counter() - started
    sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"kinetoscope analyze exited {proc.returncode}: {err.decode()[-500:]}")
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # only this child ended since ru0
    cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss": max(sampler.peak.values())}


def run_cluster(job: Path, store: Path, workers: int, env_extra: dict[str, str], preload: bool) -> dict[str, float]:
    """Start a scheduler and N worker processes as a user would, run the batch on them, stop them."""
    tmp = Path(tempfile.mkdtemp(prefix="kinetoscope-sched-"))
    sched_file = tmp / "scheduler.json"
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False", **env_extra}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    dask = [PY, "-m", "distributed.cli.dask_scheduler"]
    procs = [subprocess.Popen([*dask, "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                               "--scheduler-file", str(sched_file)], env=env, **quiet)]
    try:
        while not sched_file.exists():
            time.sleep(0.1)
        time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        nanny = subprocess.Popen([PY, "-m", "distributed.cli.dask_worker", address, "--nworkers", str(workers),
                                  "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1",
                                  *(["--preload", "kinetoscope.batch.task"] if preload else [])], env=env, **quiet)
        procs.append(nanny)
        from dask.distributed import Client

        with Client(address, timeout="60s") as client:
            client.wait_for_workers(workers, timeout=120)
        root = psutil.Process(nanny.pid)

        def worker_procs() -> list[psutil.Process]:
            try:
                return root.children(recursive=True)
            except psutil.Error:
                return []

        before = Sampler(worker_procs)
        before.stop()
        sampler = Sampler(worker_procs)
        started = time.perf_counter()
        out = subprocess.run([PY, "-m", "kinetoscope", "batch", str(job), "--store", str(store), "--scheduler",
                              address, "--quiet"], capture_output=True, text=True)
        wall = time.perf_counter() - started
        sampler.stop()
        if out.returncode != 0 or " 0 failed" not in out.stdout:
            raise SystemExit(f"kinetoscope batch failed ({out.returncode}): {out.stdout[-500:]} {out.stderr[-500:]}")
        cpu = sum(sampler.cpu.values()) - sum(before.cpu.get(pid, 0.0) for pid in sampler.cpu)
        return {"wall_s": wall, "cpu_s": cpu, "peaks": sorted(sampler.peak.values(), reverse=True)[:workers],
                "note": "note:" in out.stdout}
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)


def run_local(job: Path, store: Path, workers: int) -> dict[str, float]:
    """``kinetoscope batch --workers N``: the batch's own local cluster, started and stopped inside the timing."""
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen([PY, "-m", "kinetoscope", "batch", str(job), "--store", str(store), "--workers",
                             str(workers), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)

    def workers_of() -> list[psutil.Process]:
        try:
            return [p for p in root.children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]
        except psutil.Error:
            return []

    sampler = Sampler(workers_of)
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    sampler.stop()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(store, ignore_errors=True)
    if proc.returncode != 0 or " 0 failed" not in out:
        raise SystemExit(f"kinetoscope batch failed ({proc.returncode}): {out[-500:]} {err[-500:]}")
    # CPU of every process of the batch (driver, scheduler and workers: the driver reaps them all)
    cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    return {"wall_s": wall, "cpu_s": cpu, "peaks": sorted(sampler.peak.values(), reverse=True)[:workers],
            "note": "note:" in out}


def _stats(values: list[float]) -> str:
    spread = f" (min {min(values):.2f}, max {max(values):.2f})" if len(values) > 1 else ""
    return f"median of {len(values)} {statistics.median(values):.2f}{spread}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--kernels", type=int, default=150)
    ap.add_argument("--variants", default="dask,fixed,local", help="cluster runs per repeat (comma-separated)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/kinetoscope-tput"))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--min-free-gb", type=float, default=5.0,
                    help="refuse to generate a job that would leave less free disk than this (default 5)")
    args = ap.parse_args()
    job = args.dir / f"job-{args.ranks}"
    truth = args.dir / f"job-{args.ranks}.truth"
    try:
        if not truth.exists():
            # ~17.45 MB per rank at 150 steps x 150 kernels (measured); roughly in proportion to steps x kernels
            need = args.ranks * 17.45e6 * (args.steps / 150) * ((args.kernels + 10) / 160)
            args.dir.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(args.dir).free
            if free - need < args.min_free_gb * 1e9:
                print(f"not generated: {args.ranks} ranks need ~{need / 1e9:.1f} GB and {free / 1e9:.1f} GB are free "
                      f"(--min-free-gb {args.min_free_gb:g}); use fewer --ranks")
                return 1
            write_job(job, args.ranks, args.steps, args.kernels)
        files = sorted(job.glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        size = sum(p.stat().st_size for p in files)
        print(f"job: {len(files)} ranks, {size / 1e9:.2f} GB of JSON ({size / len(files) / 1e6:.1f} MB per rank); "
              f"{args.workers} workers; {os.cpu_count()} cores; load average at start "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        envs = {"dask": {}, "fixed": dict(MALLOC_ENV), "tuned": {**MALLOC_ENV, **WORKER_ENV}}
        ratios: dict[str, list[float]] = {v: [] for v in args.variants.split(",")}
        cpu_ratios: dict[str, list[float]] = {v: [] for v in ratios}
        for rep in range(args.repeats):
            single = run_single(files)
            s_mb = size / single["wall_s"] / 1e6
            print(f"[{rep + 1}] single process: {single['wall_s']:.1f} s, {s_mb:.0f} MB/s, "
                  f"{single['cpu_s'] / len(files):.3f} CPU s per rank, peak RSS {single['peak_rss'] / 2**20:.0f} MiB; "
                  f"load {os.getloadavg()[0]:.2f}")
            for variant in ratios:
                if variant == "local":
                    r = run_local(job, args.dir / "store-local", args.workers)
                else:
                    r = run_cluster(job, args.dir / f"store-{variant}", args.workers, envs[variant],
                                    preload=variant in ("fixed", "tuned"))
                per_worker = size / r["wall_s"] / 1e6 / args.workers
                ratios[variant].append(per_worker / s_mb)
                cpu_ratios[variant].append(single["cpu_s"] / r["cpu_s"])
                who = "all processes" if variant == "local" else "workers"
                print(f"    {variant:5s} cluster: {r['wall_s']:.1f} s, {len(files) / r['wall_s'] * 60:.0f} ranks/min, "
                      f"{size / r['wall_s'] / 1e6:.0f} MB/s, {per_worker:.0f} MB/s per worker = "
                      f"{per_worker / s_mb:.2f} x single; {r['cpu_s'] / len(files):.3f} CPU s per rank ({who}); "
                      f"peak RSS per worker {', '.join(f'{p / 2**20:.0f}' for p in r['peaks'])} MiB"
                      f"{'; batch printed the allocator note' if r['note'] else ''}; load {os.getloadavg()[0]:.2f}")
        for variant, rs in ratios.items():
            print(f"{variant}: per-worker speed / single-process speed (wall), {_stats(rs)}; "
                  f"per CPU second, single / cluster CPU per rank, {_stats(cpu_ratios[variant])}")
    finally:
        if not args.keep:
            shutil.rmtree(job, ignore_errors=True)
            truth.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
