"""An event-dense Kineto trace of a launch-bound loop, written the way Kineto writes it (one event per line,
the same fields and args as a PyTorch 2.x trace): per step a ProfilerStep, and per kernel an aten op, its
cudaLaunchKernel, the kernel, the ac2g flow pair and the allocator's [memory] events.

    python benchmarks/dense_trace.py OUT.json --steps 1500 [--kernels 200] [--gzip]

Each step is ``kernels`` short kernels (2-6 us) launched back to back by a host that needs ~7 us per launch:
a launch-bound loop, the densest shape real traces take (~1.7k events per MB).
"""

from __future__ import annotations

import argparse
import gzip
import random
from collections.abc import Iterator
from pathlib import Path

_KERNELS = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3> >"
    "(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
    "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, "
    "at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)"
    "::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, "
    "at::detail::Array<char*, 2>)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
    "at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >"
    "(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4>)",
    "ampere_sgemm_32x32_sliced1x4_nn",
]
_OPS = ["aten::add", "aten::gelu", "aten::mean", "aten::mm"]
PID, TID, STREAM = 4242, 4242, 7


def _events(steps: int, kernels: int, seed: int) -> Iterator[str]:
    rnd = random.Random(seed)
    t = 1_700_000_000_000.0  # us
    corr = 1
    ext = 1
    ev = 0
    allocated = 1 << 30
    for s in range(steps):
        step_start = t
        body: list[str] = []
        gpu_free = t + 20.0
        t += 20.0
        for k in range(kernels):
            j = k % len(_OPS)
            op_start = t
            launch = op_start + 2.0
            launch_dur = 5.0 + rnd.random()
            k_start = max(gpu_free, launch + launch_dur + 1.0)
            k_dur = 2.0 + 4.0 * rnd.random()
            gpu_free = k_start + k_dur
            op_end = launch + launch_dur + 1.0
            nbytes = 4096 * (1 + j)
            body.append(
                f'  {{\n    "ph": "X", "cat": "cpu_op", "name": "{_OPS[j]}", "pid": {PID}, "tid": {TID},\n'
                f'    "ts": {op_start:.3f}, "dur": {op_end - op_start:.3f},\n'
                f'    "args": {{\n      "External id": {ext},"Record function id": 0, '
                '"Input Dims": [[64, 1024], [64, 1024]], '
                f'"Input type": ["float", "float"], "Ev Idx": {ev}\n    }}\n  }}')
            body.append(
                '  {\n    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",\n'
                f'    "pid": {PID}, "tid": {TID},\n'
                f'    "ts": {op_start + 1.0:.3f},\n    "args": {{\n      "Total Reserved": {2 << 30}, '
                '"Total Allocated": '
                f'{allocated + nbytes}, "Bytes": {nbytes}, "Addr": {140000000000000 + 512 * k}, "Device Id": 0, '
                f'"Device Type": 1, "Ev Idx": {ev + 1}\n    }}\n  }}')
            body.append(
                f'  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {PID}, "tid": {TID},\n'
                f'    "ts": {launch:.3f}, "dur": {launch_dur:.3f},\n'
                f'    "args": {{\n      "External id": {ext},\n      "cbid": 211, "correlation": {corr}\n    }}\n  }}')
            body.append(f'  {{\n    "ph": "s", "id": {corr}, "pid": {PID}, "tid": {TID}, "ts": {launch:.3f},\n'
                        f'    "cat": "ac2g", "name": "ac2g"\n  }}')
            body.append(
                f'  {{\n    "ph": "X", "cat": "kernel", "name": "{_KERNELS[j]}", "pid": 0, "tid": {STREAM},\n'
                f'    "ts": {k_start:.3f}, "dur": {k_dur:.3f},\n'
                f'    "args": {{\n      "External id": {ext},\n      "queued": 0, "device": 0, "context": 1,\n'
                f'      "stream": {STREAM}, "correlation": {corr},\n      "registers per thread": 32,\n'
                f'      "shared memory": 0,\n      "blocks per SM": 0.5,\n      "warps per SM": 2.0,\n'
                f'      "grid": [64, 1, 1],\n      "block": [256, 1, 1],\n'
                f'      "est. achieved occupancy %": 3\n    }}\n  }}')
            body.append(f'  {{\n    "ph": "f", "id": {corr}, "pid": 0, "tid": {STREAM}, "ts": {k_start:.3f},\n'
                        f'    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }}')
            body.append(
                '  {\n    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",\n'
                f'    "pid": {PID}, "tid": {TID},\n'
                f'    "ts": {op_end - 0.5:.3f},\n    "args": {{\n      "Total Reserved": {2 << 30}, "Total Allocated": '
                f'{allocated}, "Bytes": {-nbytes}, "Addr": {140000000000000 + 512 * k}, "Device Id": 0, '
                f'"Device Type": 1, "Ev Idx": {ev + 2}\n    }}\n  }}')
            corr += 1
            ext += 1
            ev += 3
            t = op_end + 0.5
        t = max(t, gpu_free) + 5.0
        yield (f'  {{\n    "ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{s}", '
               f'"pid": {PID}, "tid": {TID},\n'
               f'    "ts": {step_start:.3f}, "dur": {t - step_start:.3f},\n'
               f'    "args": {{\n      "External id": {ext}, "Record function id": 0, "Ev Idx": {ev}\n    }}\n  }}')
        ext += 1
        ev += 1
        yield from body


def write_dense_trace(path: Path, steps: int, kernels: int = 200, *, seed: int = 0, gz: bool = False) -> int:
    """Write the trace; returns its size in bytes (of the JSON, before gzip)."""
    head = ('{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", '
            '"totalGlobalMem": 85045493760, "computeMajor": 9, "computeMinor": 0, "numSms": 132}],\n  '
            '"distributedInfo": {"backend": "nccl", '
            '"rank": 0, "world_size": 1},\n  "traceEvents": [\n')
    tail = ('\n  ],\n  "traceName": "dense", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000\n}\n')
    size = 0
    opener = gzip.open if gz else open
    with opener(path, "wb") as fh:
        fh.write(head.encode())
        size += len(head)
        first = True
        buf: list[str] = []
        for text in _events(steps, kernels, seed):
            buf.append(text if first else ",\n" + text)
            first = False
            if len(buf) >= 4096:
                chunk = "".join(buf).encode()
                fh.write(chunk)
                size += len(chunk)
                buf = []
        chunk = "".join(buf).encode() + tail.encode()
        fh.write(chunk)
        size += len(chunk)
    return size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--kernels", type=int, default=200)
    ap.add_argument("--gzip", action="store_true")
    args = ap.parse_args()
    size = write_dense_trace(args.out, args.steps, args.kernels, gz=args.gzip)
    print(f"{args.out}: {size / 1e6:,.1f} MB of JSON")


if __name__ == "__main__":
    main()
