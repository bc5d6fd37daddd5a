"""What taking a batch from a DataLoader worker costs the training loop on this machine, measured.

A loop that loads its batches in the training process (``num_workers=0``) is told what workers would be worth,
and that hinges on one number the trace cannot show: what each batch costs the loop to take from a worker (the
queue, unpickling, receiving and mapping each tensor's shared memory). It is not small: ~1-1.5 ms a batch on a
2-vCPU VM whatever the batch's size, where readers of traces often assume a tenth of that. A loop with workers is
told what more of them would be worth, and its waits hold the hand-over and the workers' lateness together: where no
ready batch tells them apart, this measure does.

The probe, at the end of a capture when the training has stopped: one forked worker sends batches shaped like the
training loader's first one (its tensors' shapes and dtypes, new zero-filled tensors each time, as a worker's
collate makes new ones), and the loop's ``next()`` is timed once the worker has had time to get each one ready:
what remains is the hand-over alone. A few tens of samples, well under a second for batches of a few MB.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
import warnings
from typing import Any

#: batches timed (after the first, which starts the worker)
SAMPLES = 20
#: the probe stops sampling after this long (what it has by then is kept, if enough)
DEADLINE_S = 3.0
#: fewer samples than this measure nothing
MIN_SAMPLES = 5
#: a batch larger than this is not sent (the probe would hold two copies of it)
MAX_BATCH_BYTES = 512 * 2**20
#: the worker gets at least this long to get the next batch ready, and twice what building one took here
MIN_GAP_S = 0.004
MAX_GAP_S = 0.2

_ELEMENT_BYTES = {"float64": 8, "double": 8, "int64": 8, "long": 8, "complex64": 8, "float32": 4, "float": 4,
                  "int32": 4, "int": 4, "float16": 2, "half": 2, "bfloat16": 2, "int16": 2, "short": 2, "uint8": 1,
                  "int8": 1, "bool": 1}


def _tensors(skeleton: Any) -> list[tuple[list[int], str]]:
    """The (shape, dtype) of every tensor in a batch skeleton (``hooks.batch_skeleton``)."""
    if isinstance(skeleton, dict) and "shape" in skeleton and "dtype" in skeleton:
        return [(list(skeleton["shape"]), str(skeleton["dtype"]))]
    if isinstance(skeleton, dict) and "tuple" in skeleton:
        return [t for v in skeleton["tuple"] for t in _tensors(v)]
    if isinstance(skeleton, dict) and "dict" in skeleton:
        return [t for v in skeleton["dict"].values() for t in _tensors(v)]
    if isinstance(skeleton, list):
        return [t for v in skeleton for t in _tensors(v)]
    return []


def batch_bytes(skeleton: Any) -> int | None:
    """The bytes a batch of this skeleton's tensors holds; None where a dtype is not known here."""
    total = 0
    for shape, dtype in _tensors(skeleton):
        size = _ELEMENT_BYTES.get(dtype)
        if size is None:
            return None
        n = 1
        for d in shape:
            n *= int(d)
        total += n * size
    return total


def _build(torch: Any, skeleton: Any) -> Any:
    """A new batch of zero-filled tensors with the skeleton's structure."""
    if isinstance(skeleton, dict) and "shape" in skeleton:
        return torch.zeros(skeleton["shape"], dtype=getattr(torch, skeleton["dtype"]))
    if isinstance(skeleton, dict) and "tuple" in skeleton:
        return tuple(_build(torch, v) for v in skeleton["tuple"])
    if isinstance(skeleton, dict) and "dict" in skeleton:
        return {k: _build(torch, v) for k, v in skeleton["dict"].items()}
    if isinstance(skeleton, list):
        return [_build(torch, v) for v in skeleton]
    return None


class _Batches:
    """A map-style dataset whose every item is a new batch of the skeleton's shapes (built in the worker)."""

    def __init__(self, skeleton: Any, n: int) -> None:
        self.skeleton = skeleton
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch

        return _build(torch, self.skeleton)


def not_measured(why: str) -> dict[str, Any]:
    return {"median_ns": None, "p10_ns": None, "p90_ns": None, "samples": 0, "batch_bytes": None, "workers": 1,
            "why": why}


def probe_handover(skeleton: Any, samples: int = SAMPLES, deadline_s: float = DEADLINE_S) -> dict[str, Any]:
    """What ``next()`` costs the loop when one worker has a batch of this skeleton ready: median, 10th and 90th
    percentiles over ``samples`` batches (ns), the batch's bytes; or why it was not measured (``why``)."""
    tensors = _tensors(skeleton)
    if not tensors:
        return not_measured("the training loader's batch holds no CPU tensor the capture could describe")
    size = batch_bytes(skeleton)
    if size is None:
        return not_measured("the batch holds a tensor of a dtype the probe does not build")
    if size > MAX_BATCH_BYTES:
        return not_measured(f"the batch is {size / 2**20:.0f} MiB, over the probe's {MAX_BATCH_BYTES >> 20} MiB")
    if "fork" not in multiprocessing.get_all_start_methods():
        return not_measured("this platform cannot fork a worker (a spawned one would import the script again)")
    import torch
    from torch.utils.data import DataLoader

    t0 = time.perf_counter()
    _build(torch, skeleton)
    gap = min(MAX_GAP_S, max(MIN_GAP_S, 2 * (time.perf_counter() - t0)))
    times: list[int] = []
    end = time.perf_counter() + deadline_s
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Python 3.12+ warns on forking a process with threads: DataLoader's own way
        dataset: Any = _Batches(skeleton, samples + 1)  # a map-style dataset (len and getitem), not a subclass
        loader = DataLoader(dataset, batch_size=None, num_workers=1, prefetch_factor=2,
                            multiprocessing_context="fork", timeout=max(1.0, deadline_s))
        it = iter(loader)
        try:
            next(it)  # the worker's start
            for _ in range(samples):
                if time.perf_counter() + gap > end:
                    break
                time.sleep(gap)
                t = time.perf_counter_ns()
                next(it)
                times.append(time.perf_counter_ns() - t)
        finally:
            del it  # the worker is stopped here, not when the collector gets to it
    if len(times) < MIN_SAMPLES:
        return not_measured(f"only {len(times)} batches in the probe's {deadline_s:.0f} s")
    times.sort()
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return {"median_ns": int(statistics.median(times)), "p10_ns": pick(0.1), "p90_ns": pick(0.9),
            "samples": len(times), "batch_bytes": size, "workers": 1, "why": None}
