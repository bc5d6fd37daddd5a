"""The loader fix's model: a DataLoader's queue with k workers, simulated over the steps, and the per-batch loads
inferred from what the trace shows."""


from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kinetoscope.analyze.model.timeline import (
    handoff_ns,
)


# --- the loader fix: a DataLoader's queue with k workers ---------------------------------------------------
@dataclass(frozen=True)
class LoaderFix:
    #: the data items the training loop waits on, inside the window (graph item indices), in order
    items: np.ndarray
    #: each batch's loading time in one worker (ns), in order
    load_ns: np.ndarray
    workers: int
    prefetch: int
    #: a ready batch's hand-over to the training process (ns)
    handoff_ns: int
    #: the waits whose batch was ready (``fixes._plan_workers`` says how the trace shows it): they stay as recorded;
    #: None where nothing tells them apart
    ready: np.ndarray | None = None


def simulate_loader(fix: LoaderFix, compute_ns: np.ndarray, rounds: int = 8) -> np.ndarray:
    """Each step's wait for data in steady state: batch b goes to worker b % k, which starts it when free
    and when fewer than k * prefetch batches are outstanding; the loop takes batch b after the step's
    compute. The recorded batches repeat ``rounds`` times; the last round's waits are returned."""
    n = len(fix.load_ns)
    total = n * rounds
    k, depth = max(1, fix.workers), max(1, fix.workers * fix.prefetch)
    free = np.zeros(k)
    taken = np.zeros(total)  # when the loop took each batch
    waits = np.zeros(total)
    t = 0.0
    ready = np.zeros(total)
    started = 0
    for b in range(total):
        # batch s may start once batch s - depth has been taken (its slot in the queue is free)
        while started < total and started - depth < b:
            w = started % k
            gate = taken[started - depth] if started >= depth else 0.0
            ready[started] = max(free[w], gate) + fix.load_ns[started % n]
            free[w] = ready[started]
            started += 1
        if started <= b:  # the first batches: nothing taken yet, every slot free
            w = b % k
            ready[b] = free[w] + fix.load_ns[b % n]
            free[w] = ready[b]
            started = b + 1
        got = max(t, ready[b]) + fix.handoff_ns
        waits[b] = got - t
        taken[b] = got
        t = got + compute_ns[b % n]
    return waits[-n:]


def stalled(waits: np.ndarray, handoff: float) -> np.ndarray:
    """Waits for a batch still being prepared, as opposed to the hand-over's own jitter."""
    return waits > 2.0 * handoff + 500_000.0


def infer_worker_loads(asked: np.ndarray, taken: np.ndarray, k: int, prefetch: int, handoff: float | None = None,
                       fresh: np.ndarray | None = None, ready: np.ndarray | None = None) -> np.ndarray:
    """Each batch's loading time in its worker, inverted from the training loop's waits under the same queue
    model as ``simulate_loader``: batch b is ready when the loop got it (if it had to wait) and its worker
    could start it when its previous batch (b - k) was done and batch b - k * prefetch had been taken. A
    batch that was ready before the loop asked for it loaded in at most the time it had (taken as 0).
    In a steadily stalled loader this is exactly k steps per batch. ``handoff``: a ready batch's hand-over where
    known better than the waits tell (the capture's probe, where every wait is alike); ``fresh``: batches whose
    worker's previous batch belongs to an earlier iterator (its workers were started again in between), whose
    loading the queue cannot time (was: timed from the old iterator's batch, so the batch after a restart loaded in
    77 ms, and more workers were worth it); ``ready``: batches known to have been ready, whatever their wait."""
    n = len(asked)
    depth = max(1, k * prefetch)
    waits = taken - asked
    handoff = handoff or handoff_ns(waits)
    waited = stalled(waits, handoff)
    if ready is not None:
        waited &= ~ready
    ready = np.where(waited, taken - handoff, asked).astype(float)  # a batch not waited for: ready by then at most
    load = np.full(n, np.nan)
    for b in range(n):
        free = ready[b - k] if b >= k else np.nan
        gate = float(taken[b - depth]) if b >= depth else np.nan
        start = np.nanmax([free, gate]) if not (np.isnan(free) and np.isnan(gate)) else np.nan
        if not np.isnan(start) and not (fresh is not None and fresh[b]):
            # a batch ready before it was asked for loaded in somewhere between 0 and the time it had; the trace
            # cannot say where: taken as 0 (optimistic; a stalled loader's batches are all waited for)
            load[b] = max(ready[b] - start, 0.0) if waited[b] else 0.0
    # the first batches of the window (their worker's previous batch is before it): like the others of their kind
    known_waited = load[~np.isnan(load) & waited]
    fill_waited = (
        float(np.median(known_waited)) if len(known_waited) else float(k * np.mean(np.diff(taken))) if n > 1 else 0.0
    )
    return np.where(np.isnan(load), np.where(waited, fill_waited, 0.0), load)


