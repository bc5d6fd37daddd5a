"""A synthetic multi-rank training job, written rank by rank as Kineto would write it, with planted clock skews
and one planted straggler, and the truth beside it (``OUT_DIR.truth``, JSON).

    python benchmarks/cluster_job.py OUT_DIR --ranks 1024 [--steps 150] [--kernels 150] [--straggler 613]

Every rank runs the same loop on the true clock: per step a DataLoader wait (1 ms; the straggler's is
``--late-us`` longer), ``kernels`` compute kernels launched back to back (the same on every rank), then an
all-reduce whose NCCL kernel starts when the rank arrives and ends, on every rank, ``transfer`` after the last
arrival (NCCL's kernel waits inside for the others). Each rank's clock reads ``skew`` off the true clock: ranks
of one node (8 per node) share a node offset within +-1 ms, plus a per-rank offset within +-20 us. The NCCL kernels
carry what PyTorch >= 2.3 writes (collective name, process group, sequence number, message sizes).
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

T0_US = 1_700_000_000_000.0
LOAD_US = 1000.0
LAUNCH_US = 7.0
TRANSFER_US = 400.0
RANKS_PER_NODE = 8
_KERNEL = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
           "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")
_NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def skew_us(rank: int) -> float:
    """The planted offset of the rank's clock from the true clock (us): its node's plus its own."""
    node = rank // RANKS_PER_NODE
    return float(((node * 7919) % 2001) - 1000) + float(((rank * 104729) % 41) - 20)


def step_period_us(kernels: int, late_us: float) -> float:
    return LOAD_US + late_us + kernels * (LAUNCH_US + 1.0) + TRANSFER_US + 300.0


def write_rank(path: Path, rank: int, world: int, steps: int, kernels: int, straggler: int, late_us: float) -> int:
    """Write one rank's trace; returns its size in bytes."""
    off = skew_us(rank)
    period = step_period_us(kernels, late_us)
    pid = tid = 1000 + rank
    ranks = "[" + ", ".join(str(r) for r in range(world)) + "]"
    corr = 1
    out: list[str] = []
    for s in range(steps):
        t = T0_US + s * period  # true clock
        load = LOAD_US + (late_us if rank == straggler else 0.0)
        compute = kernels * (LAUNCH_US + 1.0)
        arrive = t + load + compute
        last = t + LOAD_US + late_us + compute  # the straggler's arrival
        end = last + TRANSFER_US
        out.append(f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{s}", "pid": {pid}, "tid": {tid}, '
                   f'"ts": {t + off:.3f}, "dur": {period - 10.0:.3f}, "args": {{"External id": {corr}}}}}')
        out.append(f'{{"ph": "X", "cat": "user_annotation", "name": '
                   f'"enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "pid": {pid}, "tid": {tid}, '
                   f'"ts": {t + off:.3f}, "dur": {load:.3f}, "args": {{}}}}')
        k = t + load
        for _ in range(kernels):
            out.append(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": {pid}, "tid": {tid}, '
                       f'"ts": {k + off:.3f}, "dur": {LAUNCH_US:.3f}, "args": {{"External id": {corr}}}}}')
            out.append(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, "tid": {tid}, '
                       f'"ts": {k + 1.0 + off:.3f}, "dur": 5.000, '
                       f'"args": {{"External id": {corr}, "correlation": {corr}}}}}')
            out.append(f'{{"ph": "X", "cat": "kernel", "name": "{_KERNEL}", "pid": 0, "tid": 7, '
                       f'"ts": {k + 6.5 + off:.3f}, "dur": 1.000, '
                       f'"args": {{"External id": {corr}, "device": 0, "stream": 7, "correlation": {corr}, '
                       f'"grid": [64, 1, 1], "block": [256, 1, 1]}}}}')
            corr += 1
            k += LAUNCH_US + 1.0
        out.append(f'{{"ph": "X", "cat": "kernel", "name": "{_NCCL}", "pid": 0, "tid": 20, "ts": {arrive + off:.3f}, '
                   f'"dur": {end - arrive:.3f}, "args": {{"device": 0, "stream": 20, "correlation": {corr}, '
                   f'"Collective name": "allreduce", "Process Group Name": "0", "Process Group Ranks": "{ranks}", '
                   f'"In msg nelems": 6553600, "Out msg nelems": 6553600, "Group size": {world}, "Seq": {s}}}}}')
        corr += 1
    head = (f'{{"schemaVersion": 1, "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world}}}, '
            '"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": [\n')
    data = (head + ",\n".join(out) + '\n], "displayTimeUnit": "ms"}\n').encode()
    path.write_bytes(data)
    return len(data)


def _one(args: tuple[str, int, int, int, int, int, float]) -> int:
    folder, rank, world, steps, kernels, straggler, late = args
    return write_rank(Path(folder) / f"rank-{rank}.json", rank, world, steps, kernels, straggler, late)


def write_job(folder: Path, world: int, steps: int = 150, kernels: int = 150, straggler: int | None = None,
              late_us: float = 600.0, processes: int = 2) -> int:
    """Write every rank and ``truth.json``; returns the job's size in bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    straggler = (world * 3) // 5 if straggler is None else straggler
    jobs = [(str(folder), r, world, steps, kernels, straggler, late_us) for r in range(world)]
    with ProcessPoolExecutor(processes) as pool:
        size = sum(pool.map(_one, jobs, chunksize=8))
    truth = {"world": world, "steps": steps, "straggler": straggler, "late_us": late_us, "cause": "input",
             "skew_us": {str(r): skew_us(r) for r in range(world)}}
    (folder.parent / f"{folder.name}.truth").write_text(json.dumps(truth))
    return size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--kernels", type=int, default=150)
    ap.add_argument("--straggler", type=int, default=None)
    ap.add_argument("--late-us", type=float, default=600.0)
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    size = write_job(args.out, args.ranks, args.steps, args.kernels, args.straggler, args.late_us, args.processes)
    print(f"{args.out}: {args.ranks} ranks, {size / 1e9:,.2f} GB of JSON")


if __name__ == "__main__":
    main()
