"""Time and memory of a hang dump and of its analysis at R ranks x E flight recorder entries.

``python benchmarks/hang_dumps.py [--ranks 8] [--entries 2000] [--runs 5]``

The dump: a real one-rank gloo process group that has run E all_reduces (so torch's recorder holds E entries),
then ``HangWatch.dump`` written R times (median): the recorder's JSON, every thread's stack, redaction, the atomic
write. The analysis: R such dumps (rank r's copy with its rank, and rank R-1 stopped one collective early) read back
and diagnosed by ``kinetoscope analyze`` (load_job + build_report), time and peak Python memory (tracemalloc).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_dump(out: Path, entries: int, runs: int) -> tuple[bytes, list[float]]:
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(entries)
    import torch
    import torch.distributed as dist

    from kinetoscope.capture.hangwatch import HangWatch

    store = dist.HashStore()
    dist.init_process_group("gloo", rank=0, world_size=1, store=store)
    x = torch.ones(256)
    for _ in range(entries):
        dist.all_reduce(x)
    walls = [5_000_000] * 100
    watch = HangWatch(out, lambda: (entries, time.perf_counter_ns(), walls), timeout_s=0, fr_entries=entries)
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        path = watch.dump("SIGUSR1")
        took.append(time.perf_counter() - t0)
    assert path is not None
    dist.destroy_process_group()
    return path.read_bytes(), took


def write_job(job: Path, data: bytes, ranks: int) -> None:
    import msgspec

    from kinetoscope.hangdump import HangDump, hang_dump_name

    base = msgspec.json.decode(data, type=HangDump)
    for r in range(ranks):
        fr = dict(base.flight_recorder or {})
        entries = [dict(e) for e in fr.get("entries", [])]
        if r == ranks - 1:
            entries = entries[:-1]  # this rank never entered the last collective
        else:
            entries[-1]["retired"] = False
        fr["entries"] = entries
        dump = msgspec.structs.replace(base, rank=r, world_size=ranks, flight_recorder=fr)
        (job / hang_dump_name(r)).write_bytes(dump.to_json())


def analyse(job: Path, *, traced: bool = False) -> tuple[float, int, dict]:
    """Seconds (``traced``: under tracemalloc, which slows Python down; for the peak only), peak bytes, the result."""
    from kinetoscope.analyze.ingest.jobs import find_jobs
    from kinetoscope.analyze.ingest.loader import load_job
    from kinetoscope.analyze.report.builder import build_report

    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    report = build_report(load_job(find_jobs(job)[0]))
    took = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    if traced:
        tracemalloc.stop()
    return took, peak, report.job["hang"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp, "one")
        data, took = make_dump(one, args.entries, args.runs)
        print(f"dump: {len(data) / 2**20:.2f} MiB, median {statistics.median(took) * 1000:.1f} ms "
              f"(min {min(took) * 1000:.1f}, max {max(took) * 1000:.1f}) over {args.runs}")
        job = Path(tmp, "job")
        job.mkdir()
        write_job(job, data, args.ranks)
        analyse(job)  # imports
        runs = [analyse(job) for _ in range(args.runs)]
        times = [t for t, _, _ in runs]
        peak = analyse(job, traced=True)[1]
        print(f"analysis of {args.ranks} ranks x {args.entries} entries: median {statistics.median(times):.3f} s "
              f"(min {min(times):.3f}, max {max(times):.3f}), peak Python memory {peak / 2**20:.1f} MiB")
        hang = runs[0][2]
        print(f"diagnosis: seq {hang['seq']}, missing {hang['missing_ranks']}, waiting {hang['waiting_ranks']}")


if __name__ == "__main__":
    main()
