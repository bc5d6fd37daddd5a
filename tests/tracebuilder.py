"""Build small Kineto traces in code, with answers known by construction.

Times are given in microseconds, as Kineto writes them.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

MAIN_PID = 100
MAIN_TID = 100
#: an all-reduce kernel as NCCL names it
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


class TraceBuilder:
    def __init__(self, *, rank: int | None = None, world_size: int | None = None, metadata: bool = True,
                 device_properties: list[dict[str, Any]] | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.top: dict[str, Any] = {"schemaVersion": 1}
        if rank is not None:
            self.top["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size or rank + 1}
        if device_properties is not None:
            self.top["deviceProperties"] = device_properties
        self._corr = 1000
        if metadata:
            self.events.append({"ph": "M", "name": "process_name", "pid": MAIN_PID, "tid": 0,
                                "args": {"name": "python"}})
            self.events.append({"ph": "M", "name": "thread_name", "pid": MAIN_PID, "tid": MAIN_TID,
                                "args": {"name": "main"}})

    # --- host side -----------------------------------------------------------------
    def op(self, name: str, ts: float, dur: float, *, cat: str = "cpu_op", tid: int = MAIN_TID,
           **args: Any) -> TraceBuilder:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": MAIN_PID, "tid": tid, "ts": ts, "dur": dur,
                            "args": args})
        return self

    def step(self, n: int, ts: float, dur: float) -> TraceBuilder:
        return self.op(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def loader(self, ts: float, dur: float, *, multiprocess: bool = False) -> TraceBuilder:
        it = "_MultiProcessingDataLoaderIter" if multiprocess else "_SingleProcessDataLoaderIter"
        return self.op(f"enumerate(DataLoader)#{it}.__next__", ts, dur, cat="user_annotation")

    def runtime(self, name: str, ts: float, dur: float, correlation: int | None = None, *,
                tid: int = MAIN_TID) -> TraceBuilder:
        args = {"cbid": 1}
        if correlation is not None:
            args["correlation"] = correlation
        return self.op(name, ts, dur, cat="cuda_runtime", tid=tid, **args)

    # --- device side ---------------------------------------------------------------
    def _next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def kernel(self, ts: float, dur: float, *, stream: int = 7, device: int = 0, name: str = "gemm_kernel",
               launch_at: float | None = None, launch_dur: float = 5.0, launch_tid: int = MAIN_TID) -> TraceBuilder:
        corr = self._next_corr()
        if launch_at is not None:
            self.runtime("cudaLaunchKernel", launch_at, launch_dur, corr, tid=launch_tid)
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts,
                            "dur": dur, "args": {"device": device, "stream": stream, "correlation": corr}})
        return self

    def memcpy(self, ts: float, dur: float, *, direction: str = "HtoD", host: str = "Pageable", nbytes: int = 1 << 20,
               stream: int = 7, device: int = 0, call: str | None = None, call_at: float | None = None) -> TraceBuilder:
        corr = self._next_corr()
        if call is not None:
            self.runtime(call, call_at if call_at is not None else ts - 5, 5.0, corr)
        src, dst = (host, "Device") if direction == "HtoD" else ("Device", host)
        if direction == "DtoD":
            src = dst = "Device"
        self.events.append({"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy {direction} ({src} -> {dst})",
                            "pid": device, "tid": stream, "ts": ts, "dur": dur,
                            "args": {"device": device, "stream": stream, "correlation": corr, "bytes": nbytes}})
        return self

    def memory(self, ts: float, nbytes: int, *, allocated: int | None, reserved: int | None = None,
               device_type: int = 1, device_id: int = 0, addr: int = 1234) -> TraceBuilder:
        args: dict[str, Any] = {"Bytes": nbytes, "Device Type": device_type, "Device Id": device_id, "Addr": addr}
        if allocated is not None:
            args["Total Allocated"] = allocated
        if reserved is not None:
            args["Total Reserved"] = reserved
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": MAIN_PID,
                            "tid": MAIN_TID, "ts": ts, "args": args})
        return self

    def raw(self, event: dict[str, Any]) -> TraceBuilder:
        self.events.append(event)
        return self

    # --- output --------------------------------------------------------------------
    def document(self, *, bare_array: bool = False) -> Any:
        if bare_array:
            return list(self.events)
        return {**self.top, "traceEvents": list(self.events)}

    def write(self, path: Path, *, bare_array: bool = False) -> Path:
        data = json.dumps(self.document(bare_array=bare_array)).encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
        return path


def straggler_job(folder: Path, slow: int = 2, n: int = 4, steps: int = 5, late_us: float = 300.0) -> None:
    """Rank ``slow`` waits ``late_us`` longer for data every step, so it arrives last at every all-reduce."""
    for r in range(n):
        b = TraceBuilder(rank=r, world_size=n)
        for s in range(steps):
            t = s * 2000
            load = 100 + (late_us if r == slow else 0)
            b.step(s, t, 2000).loader(t, load, multiprocess=True)
            b.kernel(t + load, 800, name="gemm", launch_at=t + load, launch_dur=5)
            b.kernel(t + load + 800, 1900 - load - 800, stream=20, name=NCCL)
        b.write(folder / f"rank-{r}.json")


def ddp_step(steps: int = 3, **builder: Any) -> TraceBuilder:
    """Each 1000 us step: a forward op (+10..+200) launching a 150 us kernel, a backward op (+300..+700) launching
    a 300 us kernel (+310..+610) and DDP's gradient all-reduce (launched at +620, runs +620..+920 with no compute
    beside it), a sync from +700 that returns 5 us after it, 75 us of host work, on an A100. ``builder``: the
    TraceBuilder's own arguments (rank, world_size)."""
    b = TraceBuilder(device_properties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}], **builder)
    for k in range(steps):
        t = 10_000 + 1000 * k
        b.step(k, t, 1000)
        b.op("aten::linear", t + 10, 190)
        b.kernel(t + 30, 150, name="fwd_gemm", launch_at=t + 20)
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t + 300, 400)
        b.kernel(t + 310, 300, name="bwd_gemm", launch_at=t + 305)
        b.kernel(t + 620, 300, name=NCCL, stream=20, launch_at=t + 615)
        b.runtime("cudaStreamSynchronize", t + 700, 225)
    return b
