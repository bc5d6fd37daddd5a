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
               launch_at: float | None = None, launch_dur: float = 5.0, launch_tid: int = MAIN_TID,
               args: dict[str, Any] | None = None) -> TraceBuilder:
        """``args``: more of the kernel's args (a collective's "Collective name", "Process Group Ranks" ...)."""
        corr = self._next_corr()
        if launch_at is not None:
            self.runtime("cudaLaunchKernel", launch_at, launch_dur, corr, tid=launch_tid)
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts,
                            "dur": dur, "args": {"device": device, "stream": stream, "correlation": corr,
                                                 **(args or {})}})
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
               device_type: int = 1, device_id: int = 0, addr: int | None = None) -> TraceBuilder:
        """A ``[memory]`` event; ``addr`` None: an address no other event of this builder has (one address shared by
        every allocation would read as frees the trace did not record)."""
        if addr is None:
            addr = 1 << 40 | sum(e.get("name") == "[memory]" for e in self.events) << 12
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


def slow_loader_job(folder: Path) -> None:
    """Three ranks of a gzip job; rank 1 loads data slowly, so ranks 0 and 2 wait in the all-reduce (the batch and
    object-storage tests' job)."""
    for rank, (wait, load) in {0: (600, 50), 1: (100, 550), 2: (580, 60)}.items():
        b = TraceBuilder(rank=rank, world_size=3)
        for step in range(3):
            t = step * 1000
            b.step(step, t, 1000).loader(t, load).kernel(t + load, 300, name="gemm")
            b.kernel(t + 400, wait, name="ncclDevKernel_AllReduce_Sum_f32")
        b.write(folder / f"trainer.rank-{rank}.json.gz")


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


#: NCCL's kernel for send and recv (and all-to-all): its name says neither
SENDRECV_KERNEL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def _stage_order(schedule: str, stages: int, micro: int, s: int) -> list[tuple[str, int]]:
    """Stage ``s``'s tasks in order: GPipe (every forward, then every backward) or 1F1B (``stages - 1 - s`` forwards
    of warm-up, then one forward one backward, then the backwards left)."""
    if schedule == "gpipe":
        return [("F", i) for i in range(micro)] + [("B", i) for i in range(micro)]
    warm = min(stages - 1 - s, micro)
    order = [("F", i) for i in range(warm)]
    for i in range(micro - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in range(micro - warm, micro)]


def pipeline_job(*, stages: int, micro: int, schedule: str = "gpipe", fwd_us: float = 100.0, bwd_us: float = 200.0,
                 steps: int = 3, host_us: float = 100.0, send_us: float = 1.0,
                 world_group: bool = False) -> list[TraceBuilder]:
    """A pipeline-parallel job on A100s, one rank per stage, its bubbles known by construction: each step, a rank's
    host launches every kernel of the step in its first ``host_us`` (1 us apiece), then waits in a
    cudaDeviceSynchronize for the last; the GPU starts ``host_us`` after the step. Each forward (``fwd_us``) and
    backward (``bwd_us``) is one kernel on stream 7; a stage receives each input on stream 20 in a SendRecv kernel
    posted when its previous receive ended (the step's first at the GPU's start), which ends when the neighbour's
    kernel producing it ends (transfers take no time), and sends each output on stream 21 in a ``send_us`` kernel
    from the end of the kernel producing it. Kernels carry "Collective name" and "Process Group Ranks" (a two-rank
    group per pair of neighbours; ``world_group``: every send/recv in one group of all the ranks, which names no peer),
    as recent Kineto writes them. A rank's next step starts when its last kernel ends.
    Simulated from a step before the first (not written), so every written step is alike: with equal stage times, each
    stage's GPU waits (stages - 1) x (fwd_us + bwd_us) a step, and the schedule spans (micro + stages - 1) x
    (fwd_us + bwd_us) (GPipe's bubble fraction (p - 1) / (m + p - 1)); a step spans that plus ``host_us``."""
    builders = [TraceBuilder(rank=s, world_size=stages, device_properties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}])
                for s in range(stages)]
    host_start = [10_000.0] * stages
    for k in range(-1, steps):
        done: dict[tuple[str, int, int], float] = {}  # (kind, stage, microbatch) -> the end of its kernel
        kernels: list[list[tuple[float, float, int, str, dict[str, Any]]]] = [[] for _ in range(stages)]
        free = [h + host_us for h in host_start]
        recv_free = list(free)
        pending = {s: _stage_order(schedule, stages, micro, s) for s in range(stages)}
        while any(pending.values()):
            progressed = False
            for s in range(stages):
                while pending[s]:
                    kind, i = pending[s][0]
                    src = s - 1 if kind == "F" else s + 1
                    needs = 0 <= src < stages
                    if needs and (kind, src, i) not in done:
                        break
                    pending[s].pop(0)
                    progressed = True
                    start = free[s]
                    if needs:
                        arrival = done[(kind, src, i)]
                        ranks = sorted([s, src]) if not world_group else list(range(stages))
                        group = {"Process Group Ranks": str(ranks), "Collective name": "recv"}
                        r0 = recv_free[s]
                        if arrival > r0:
                            kernels[s].append((r0, arrival - r0, 20, SENDRECV_KERNEL, group))
                        recv_free[s] = max(r0, arrival)
                        start = max(start, arrival)
                    dur = fwd_us if kind == "F" else bwd_us
                    kernels[s].append((start, dur, 7, f"{'fwd' if kind == 'F' else 'bwd'}_gemm", {}))
                    free[s] = done[(kind, s, i)] = start + dur
                    dst = s + 1 if kind == "F" else s - 1
                    if 0 <= dst < stages:
                        kernels[s].append((start + dur, send_us, 21, SENDRECV_KERNEL,
                                           {"Process Group Ranks": str(sorted([s, dst]) if not world_group
                                                                       else list(range(stages))),
                                            "Collective name": "send"}))
            if not progressed:
                raise ValueError("the schedule deadlocks")
        for s in range(stages):
            end = max(t + d for t, d, *_ in kernels[s])
            if k >= 0:
                b = builders[s]
                b.step(k, host_start[s], end - host_start[s])
                ordered = sorted(kernels[s], key=lambda x: x[0])
                if len(ordered) + 1 > host_us:
                    raise ValueError("host_us too short to launch the step's kernels")
                for j, (t, d, stream, name, args) in enumerate(ordered):
                    b.kernel(t, d, stream=stream, name=name, launch_at=host_start[s] + j, launch_dur=1.0,
                             args=args)
                b.runtime("cudaDeviceSynchronize", host_start[s] + len(ordered), end - host_start[s] - len(ordered))
            host_start[s] = end
    return builders
