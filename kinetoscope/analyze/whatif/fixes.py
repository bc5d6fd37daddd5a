"""What each finding's fix means, in one place: one ``Fix`` record per finding id (how it is planned as an edit of
the replay, what it edits, the parameters it takes, or why it saves no time), the plans themselves, and the
checks of a fix's parameters."""


from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.collectives import comm_fix
from kinetoscope.analyze.model.commroles import collective_roles
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.hostfacts import count, no_core_for_a_worker, ranks_sharing, world_size
from kinetoscope.analyze.model.phases import evaluation_steps, evaluation_waits
from kinetoscope.analyze.model.timeline import (
    HANDOVER_CPU_SHARE,
    HANDOVER_PROBE_RATIO,
    WORKERS_BUSY_MIN_SHARE,
    _tid_mask,
    batch_at_once,
    batches_left,
    cpu_shares,
    draws_random,
    handoff_ns,
    handover_waits,
    kind_mask,
    loader_spans,
    main_thread,
    name_mask,
    other_loader_spans,
    per_item_batch,
    step_at,
    steps_taking_over,
    steps_workers_idle,
    wait_cpu_share,
    worker_starts_ns,
    workers_busy_share,
    workers_cpu_per_step,
)
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.whatif.graph import (
    GRAPH_REPLAY_NS,
    HANDOFF_PRIOR_NS,
    PCIE3,
    PINNED_GBPS,
    PINNED_GBPS_DEFAULT,
    ReplayGraph,
)
from kinetoscope.analyze.whatif.loader_queue import LoaderFix, infer_worker_loads
from kinetoscope.analyze.whatif.replay import Edits, wait_edits


# --- estimates per finding ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    edits: Edits
    method: str
    assumptions: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict)
    #: "upper" where an assumption the trace cannot check can only make the estimate optimistic (workers that
    #: take no cores or memory bandwidth from the training, on a host whose cores are not recorded); else None
    bound: str | None = None
    #: what the plan edits where its finding's ``Fix`` does not say (a finding standing for another's fix):
    #: "syncs" for the syncs-removed plan; a plan with a loader edit edits "loader"
    kind: str | None = None
    #: how its analytic savings (``Edits.analytic_ns``) are spread over the window's steps (relative weights, one
    #: per step); None: evenly
    analytic_weights: tuple[float, ...] | None = None
    #: another fix of the same finding: the estimate replays both and keeps the one worth more as the severity policy
    #: credits it (a bound at ``upper_bound_credit``)
    alternative: Plan | None = None

    @property
    def what(self) -> str | None:
        """What this plan edits, as far as the plan itself tells (None: only its finding can say)."""
        return "loader" if self.edits.loader is not None else self.kind


def _window_items(g: ReplayGraph, kind: str) -> np.ndarray:
    if not g.steps:
        return np.zeros(0, dtype=np.int64)
    m = (g.it_kind == kind) & (g.it_start >= g.step_start[0]) & (g.it_start < g.step_end[-1])
    return np.flatnonzero(m)


def _window_waits(g: ReplayGraph, trace: RankTrace | None = None) -> np.ndarray:
    """The training thread's data waits that start inside the window (indices into ``wait_start``); given the trace,
    less those an evaluation took where the capture did not mark them (``phases.evaluation_waits``, as the loader
    analysis leaves them out)."""
    if not g.steps:
        return np.zeros(0, dtype=np.int64)
    inside = (g.wait_start >= g.step_start[0]) & (g.wait_start < g.step_end[-1])
    if trace is not None:
        inside &= ~evaluation_waits(trace, g.wait_start, g.wait_end)
    return np.flatnonzero(inside)




def _fresh_batches(trace: RankTrace, g: ReplayGraph, items: np.ndarray, k: int) -> np.ndarray:
    """Which of the waits ``items`` take a batch whose worker's previous batch came before the loader's workers were
    last started (the first ``k`` batches after a start the capture marked): the queue cannot time their loading."""
    starts = worker_starts_ns(trace)
    fresh = np.zeros(len(items), dtype=bool)
    if not len(starts):
        return fresh
    era = np.searchsorted(starts, g.wait_start[items], side="right")  # how many starts came before each wait
    seen: dict[int, int] = {}  # waits so far after each start
    for i, e in enumerate(era.tolist()):
        fresh[i] = e > 0 and seen.get(e, 0) < k
        seen[e] = seen.get(e, 0) + 1
    return fresh


def _facts(trace: RankTrace) -> tuple[dict[str, Any], dict[str, Any]]:
    cap = trace.meta.capture or {}
    return dict(cap.get("host") or {}), dict(cap.get("dataloader") or {})



def _cores_together(host: dict[str, Any], cpus: int) -> tuple[float, str]:
    """(how many cores' worth of compute the host's CPUs do when all are busy, what the estimate says of it): the
    capture's probe (``cores_effective``; the loader keeps only numbers) where it ran and gave 1 to ``cpus``, else
    the CPU count."""
    measured = host.get("cores_effective")
    if measured is None:
        return float(cpus), ("all busy, they do as much as their count (not measured: cores that share a physical "
                             "core do less)")
    if not 1.0 <= measured <= cpus:
        return float(cpus), (f"all busy, they do as much as their count (the capture's measure, {measured}, is "
                             f"outside 1-{cpus} and was ignored)")
    return float(measured), f"all busy, they do {measured:.2f} cores' work (measured by the capture)"


def _ranks_on_host(host: dict[str, Any], world: int | None) -> tuple[int, str]:
    """(how many ranks share this rank's CPUs, what the estimate says of it): ``hostfacts.ranks_sharing``, with 1
    where the launcher's count is not recorded, said (each rank then counts every CPU as its own)."""
    ranks, said = ranks_sharing(host, world)
    if ranks is None:
        return 1, "how many ranks share this host is not recorded: this rank counts every CPU as its own"
    return ranks, said


def plan_loader(trace: RankTrace, g: ReplayGraph, params: dict[str, Any]) -> Plan | None:
    items = _window_waits(g, trace)
    if not len(items) or not g.steps:
        return None
    if not params:
        # a batch built item by item from tensors in memory: indexing it at once removes the per-item work and
        # keeps the copy, in the training process, with no worker to hand it over
        built = per_item_batch(trace, g.wait_start[items], g.wait_end[items])
        if built is not None:
            kind, kept = built
            edits = Edits(item_dur=wait_edits(g, items, kept))
            per_batch = float(np.mean([int(x) for x in kept])) / 1e6
            if kind == "indexing":
                return Plan(edits, "replay: the batch indexed at once",
                            (f"each wait builds its batch item by item from tensors in memory (a TensorDataset's "
                             f"__getitem__, then torch.stack): indexing the batch at once leaves the collate's copy "
                             f"({per_batch:.2f} ms a batch, measured inside the waits) and removes the rest",))
            # the rows indexed, then worked on by torch's operators item by item: on the whole batch the same
            # operators run once, on more data - what that costs is not in the trace, so removing every wait but the
            # collate's copy is the most it gives (was: only more workers replayed, worth nothing on a host whose
            # ranks fill its CPUs, where two readers and their consensus priced the batch built at once). With a core
            # free for a worker, both are replayed and the estimate keeps the one worth more
            what = ("rows of tensors in memory indexed, then torch's operators on each item" if kind == "tensor_ops"
                    else "the dataset's __getitem__ computing each item on the training thread, in work the trace "
                    "does not show as torch's (Python, a library's C code)" if kind == "python"
                    else "each item converted from what the dataset holds in memory (torch's operators once per item, "
                    "the Python around them)")
            # items converted with no random number drawn inside the waits: the same conversion every epoch, done once
            # for the dataset, leaves the collate's copy - no bound (was: a bound at half credit, so a tutorial whose
            # PIL-to-tensor conversion held 41% of its run was a warning; three sets' readers and their consensus
            # read it critical)
            fixed = kind == "transforms" and draws_random(trace, g.wait_start[items], g.wait_end[items]) is False
            at_once = Plan(edits, "replay: the batch built at once",
                           (f"each wait builds its batch item by item: {what}; building the batch at once leaves the "
                            f"collate's copy ({per_batch:.2f} ms a batch, measured inside the waits) and removes the "
                            "rest",
                            "torch draws no random number inside the waits: each item's conversion is the same every "
                            "epoch, so it can be done once for the dataset (randomness drawn in Python or NumPy would "
                            "not show here: where there is some, do it on the whole batch)" if fixed else
                            "the same work done once for the dataset or on the whole batch costs less than one call "
                            "per item, by how much is not measured: this is a bound"),
                           bound=None if fixed else "upper")
            if no_core_for_a_worker(trace):
                return at_once
            workers = _plan_workers(trace, g, params, items)
            return replace(workers, alternative=at_once) if workers is not None else at_once
        in_memory = batch_at_once(trace, g.wait_end[items] - g.wait_start[items])
        if in_memory is not None:
            # workers serving a TensorDataset: its items are rows of tensors in memory and nothing else, so the batch
            # indexed at once in the training process needs no worker, and no hand-over (was: more workers replayed,
            # worth nothing where the wait is taking each batch over, and said so at information)
            dl = (trace.meta.capture or {}).get("dataloader") or {}
            held = dl.get("dataset_tensor_bytes")
            size = (("" if not isinstance(held, int) or isinstance(held, bool)
                     else f", {held / 2**20:.1f} MiB" if held >= 2**20 / 10 else f", {held / 1024:.1f} KiB")
                    + ("" if dl.get("collate") is not None else "; its collate_fn not recorded, read as PyTorch's"))
            what = ("a TensorDataset" if in_memory == "tensor_rows" else
                    f"a dataset ({dl.get('dataset_class')}) whose waits are not the workers' own work (the hand-over "
                    "of ready batches, or workers mostly idle)")
            rest = ("the one indexing copy it still makes is not measured" if in_memory == "tensor_rows" else
                    "its __getitem__'s per-item work, done on the whole batch at once in the training process, is not "
                    "known")
            return Plan(Edits(item_dur=wait_edits(g, items, np.zeros(len(items)))),
                        "replay: the batch indexed at once in the training process",
                        (f"the training loader's {dl.get('num_workers')} workers serve {what} "
                         f"({dl.get('dataset_tensors')} tensors in memory{size}, read by the capture): indexing the "
                         "batch at once in the training process (num_workers=0) removes each wait, the workers' "
                         f"hand-over with it; {rest}, so this is a bound",),
                        bound="upper")
    return _plan_workers(trace, g, params, items)


def _plan_workers(trace: RankTrace, g: ReplayGraph, params: dict[str, Any], items: np.ndarray) -> Plan | None:
    """The loader replayed with (more) DataLoader workers: a queue simulation of the window's waits."""
    names = set(loader_spans(trace)["name"].astype(str))
    single = any("SingleProcess" in n for n in names) and not any("MultiProcessing" in n for n in names)
    host, dl = _facts(trace)
    cpus, threads = host.get("cpus"), host.get("torch_threads")
    ranks, ranks_said = _ranks_on_host(host, world_size(trace))
    waits = (g.wait_end[items] - g.wait_start[items]).astype(float)
    steps_ns = (g.step_end - g.step_start).astype(float)
    n = g.steps
    per_step_wait = float(waits.sum()) / n
    compute = max(float(steps_ns.mean()) - per_step_wait, 1.0)
    assumptions = []
    before = 0 if single else dl.get("num_workers")
    prefetch = int(params.get("prefetch_factor") or dl.get("prefetch_factor") or 2)
    load_cpu, comp_cpu = cpu_shares(trace)
    # the loop's own CPU through its waits (the training thread's, where recorded apart): taking batches over
    taking_cpu, own_cpu = wait_cpu_share(trace)
    workers_before = isinstance(before, int) and not isinstance(before, bool) and before > 0
    before_prefetch = int(dl.get("prefetch_factor") or 2)
    if single:
        load = waits  # loading runs inline: each wait is one batch's loading
        assumptions.append("num_workers=0 before: each recorded wait is one batch's full loading time")
    elif workers_before:
        load = np.zeros(len(items))  # inferred below, once the hand-over is known
    else:
        load = None
        assumptions.append("num_workers unknown (no capture manifest naming the DataLoader's configuration): assumes "
                           "enough workers to hide loading")
    target = params.get("num_workers")
    if load is not None and target is None and not single:
        target = 2 * int(before)  # type: ignore[arg-type]
        assumptions.append(f"num_workers={target} after (twice as many)")
    elif load is not None and target is None:
        need = int(math.ceil(float(load.mean()) / compute)) + 1
        # loading that mostly waits (storage, network) needs no core of its own: only CPU-heavy loading is
        # capped by the cores the training leaves free (and when its CPU use is unknown, to be safe)
        cpu_bound = load_cpu is None or load_cpu >= 0.5
        share = cpus / ranks if cpus else None  # this rank's CPUs, the same share the CPU floor below counts
        free = int(share) - (threads or 1) if share and cpu_bound else None
        target = max(1, min(need, free)) if free is not None and free > 0 else need
        said = f"{cpus} CPUs" + (f" shared by {ranks} ranks" if ranks > 1 else "")
        assumptions.append(f"num_workers={target} after (" + (
            f"{said}, {threads or 1} for training" if free is not None and free > 0
            else f"enough to hide loading; {said}, {threads or 1} for training: the workers share the training's, "
                 "which the CPU floor counts" if free is not None
            else "enough to hide loading") + ")")
    elif target is not None:
        assumptions.append(f"num_workers={target} after, prefetch_factor={prefetch}")
    if target is not None and int(target) == 0:
        return None
    # a batch prepared in a worker still has to reach the training process (collate + shared memory)
    probe = dl.get("handover_probe") if isinstance(dl.get("handover_probe"), dict) else None
    probed = probe.get("median_ns") if probe is not None else None
    handoff = int(handoff_ns(waits)) if not single else (int(probed) if probed else HANDOFF_PRIOR_NS)
    probe_used = single and bool(probed)
    # with workers, no ready batch in the window measuring the hand-over, and none given
    unmeasured = not single and not handoff and params.get("handoff_ms") is None
    taking_cpu_ns = (float(waits.mean()) * min(taking_cpu, 1.0)
                     if taking_cpu is not None and taking_cpu >= HANDOVER_CPU_SHARE else None)
    if unmeasured and probed and probe is not None and float(probed) >= (taking_cpu_ns or 0.0):
        # no ready batch in the window measures the hand-over, but the capture measured it on this host with a batch
        # shaped like the loop's: its whole wall time, the round trips with the worker included, which more workers
        # keep (was: only the loop's CPU through its waits, and the idle rest read as workers falling behind - a
        # compiled job with 2 workers 28% busy was told 4 workers were worth 4% of its run, and rerun gained
        # nothing). Where the loop's own CPU through its waits is more (the probe's batches hold tensors only and are
        # never pinned), that is taken (below). The waits bound it: each holds one hand-over (the median wait)
        handoff = int(min(float(probed), float(np.median(waits))))
        probe_used = True
    elif unmeasured and taking_cpu_ns is not None and taking_cpu is not None:
        # no ready batch to measure the hand-over by (waits alike), but the loop works through its waits
        # (loader.wait_kind's "handover"): that CPU work is taking each batch over (unpickling, collating, pinning),
        # which more workers keep (was: a hand-over of 0, and a loop told "more workers will not help" was worth its
        # whole wait with more of them). The training thread's own CPU where the capture recorded it apart; else the
        # process's, which counts all its threads (a pin-memory thread's too): an upper bound on the hand-over, said
        taking = taking_cpu_ns
        handoff = int(taking)
        whose = "the training thread's own CPU" if own_cpu else "the process's CPU (all its threads)"
        less = (f" (the capture's probe of a worker's hand-over measured less, {float(probed) / 1e6:.2f} ms: its "
                "batches hold tensors only and are never pinned)" if probed else "")
        assumptions.append(f"taking a batch over costs the loop {taking / 1e6:.2f} ms: {whose} is busy "
                           f"{taking_cpu:.0%} of its waits, the hand-over's work, which more workers keep; no ready "
                           "batch in the window measures it" + less)
    if params.get("handoff_ms") is not None:
        handoff = int(float(params["handoff_ms"]) * 1e6)
        assumptions.append(f"a batch from a worker costs the loop {handoff / 1e6:.2f} ms to take (given)")
    elif probe_used and probed and probe is not None:
        spread = (f", {probe['p10_ns'] / 1e6:.2f}-{probe['p90_ns'] / 1e6:.2f} ms from the 10th to the 90th percentile"
                  if probe.get("p10_ns") is not None and probe.get("p90_ns") is not None else "")
        bounded = (f"; the loop's median wait, {handoff / 1e6:.2f} ms, bounds it here" if handoff < probed else "")
        pinned = ("; the loader pins memory, which the probe does not: its pin-memory thread then takes the batch "
                  "over, and the loop may pay less" if not single and dl.get("pin_memory") is True else "")
        assumptions.append(f"a batch from a worker costs the loop {handoff / 1e6:.2f} ms to take: measured by the "
                           f"capture on this host, one worker handing over {probe.get('samples')} batches shaped like "
                           f"the loop's (median {probed / 1e6:.2f} ms{spread}{bounded}{pinned})")
    elif single:
        why = f" ({probe['why']})" if probe is not None and probe.get("why") else ""
        assumptions.append(f"a batch from a worker costs the loop {HANDOFF_PRIOR_NS / 1e6:.1f} ms to take (typical "
                           f"DataLoader hand-over; this trace had no workers to measure it, and the capture did not "
                           f"measure it{why})")
    ready = None
    if workers_before:
        # waits that took a batch already made, which more workers cannot make readier: with a hand-over the capture
        # measured on the host, a wait within its spread (its 90th percentile, by HANDOVER_PROBE_RATIO: was twice
        # its median and half a millisecond, so 1.0 ms waits the loop sat idle through, against a 0.30-0.35 ms
        # probe, read as ready); a wait in a step through which the workers, busy otherwise, burned no CPU, for one
        # of the last batches its iterator had (every index handed to a worker: they had nothing left to make. Was:
        # any wait in such a step, so 25 ms waits while workers slept on storage read as ready); a wait in a step
        # through which the training thread's CPU was busy half the wait or more (taking the batch over: the loader's
        # own test of a hand-over, step by step. Was: "more workers will not help" beside "num_workers=6: 3.7% of the
        # run", the replay crediting the idle third of such waits). A hand-over given by hand replaces all three
        ready = np.zeros(len(items), dtype=bool)
        if params.get("handoff_ms") is None:
            if probe_used and probe is not None:
                p90 = probe.get("p90_ns")
                probe_spread = float(p90) if isinstance(p90, (int, float)) and not isinstance(p90, bool) and p90 > 0 \
                    else float(probed)  # type: ignore[arg-type]
                ready |= waits <= HANDOVER_PROBE_RATIO * probe_spread
            number = step_at(trace, g.wait_start[items])
            ready |= np.isin(number, list(steps_taking_over(trace)))
            idle = steps_workers_idle(trace)
            if idle:
                left = batches_left(trace, g.wait_start[items], g.wait_end[items])
                with np.errstate(invalid="ignore"):
                    last = left < int(before) * before_prefetch  # type: ignore[arg-type]
                ready |= np.isin(number, list(idle)) & last
        if not ready.any():  # no ready batch: every wait is the workers', as without the tests
            ready = None
        # each batch's loading inferred with the hand-over the estimate uses (was: one read from the waits alone, 0
        # where every wait was alike, so a ready batch's 0.9 ms hand-over read as a worker late by it)
        load = infer_worker_loads(g.wait_start[items], g.wait_end[items], int(before), before_prefetch,  # type: ignore[arg-type]
                                  handoff=float(handoff), fresh=_fresh_batches(trace, g, items, int(before)),  # type: ignore[arg-type]
                                  ready=ready)
        assumptions.insert(0, f"num_workers={before}, prefetch_factor={before_prefetch} before (capture manifest): "
                              f"each batch's loading time inferred from when it became ready and when its worker "
                              f"could start it (mean {load.mean() / 1e6:.1f} ms per batch per worker; batches ready "
                              "before the loop asked for them count as free: their loading is not in the trace)")
    if load is None:
        fix = LoaderFix(items=items, load_ns=np.zeros(len(items)), workers=1, prefetch=prefetch, handoff_ns=handoff)
    else:
        assert target is not None  # both branches above that leave a load set a target
        fix = LoaderFix(items=items, load_ns=load, workers=int(target), prefetch=prefetch, handoff_ns=handoff,
                        ready=ready)
    floor = 0.0
    waiting = False
    if single and cpus and load_cpu is not None and comp_cpu is not None:
        # the loading's CPU work moves beside the training's (which also takes each batch over): together they
        # cannot outrun the CPUs, which do fewer cores' work when all are busy. Work in cores' worth: what ran on
        # more cores than they are worth together (a multi-threaded training) already ran at that rate, so it
        # counts at most that many (its part of the floor never exceeds what was recorded)
        together, said = _cores_together(host, cpus)
        cores = together / ranks  # this rank's share where the job's other ranks run on the same CPUs
        work = (compute * min(comp_cpu, cores) + float(load.mean() if load is not None else 0) * min(load_cpu, cores)
                + handoff)
        floor = work / cores
        assumptions.append(f"{cpus} CPUs shared: loading uses {load_cpu:.2f} cores while it runs, the training "
                           f"{comp_cpu:.2f} (process CPU time per step, capture), taking a batch over is CPU work; "
                           + said + (f"; {ranks_said}" if ranks_said else ""))
    elif cpus and comp_cpu is not None and (wcpu := workers_cpu_per_step(trace)) is not None:
        # workers already: their CPU per batch (one batch per step) stays, spread over more of them. These CPU times
        # were recorded with the workers and the training side by side, sharing the cores as they will after the
        # fix, and the training's includes taking batches over: over the CPU count, with nothing added
        floor = (compute * comp_cpu + wcpu) / (cpus / ranks)
        assumptions.append(f"{cpus} CPUs shared: the workers use {wcpu / 1e6:.1f} ms of CPU per batch, the training "
                           f"{comp_cpu:.2f} cores while it computes (capture: process and worker CPU time)"
                           + (f"; {ranks_said}" if ranks_said else ""))
        busy = workers_busy_share(trace)
        if (busy is not None and busy < WORKERS_BUSY_MIN_SHARE
                and taking_cpu is not None and taking_cpu < HANDOVER_CPU_SHARE and not handover_waits(trace, waits)):
            # the loop idle in its waits (loader.wait_kind's "idle_workers") and most of a batch's time in its worker
            # not the worker's work: waiting for storage or the network (more workers overlap it) or for a CPU on a
            # busy host (more workers add to it); the trace cannot tell which
            waiting = True
            assumptions.append(f"the workers' CPU is {busy:.0%} of the time a batch takes them (num_workers steps): "
                               "the rest is waiting - for storage or the network, which more workers overlap, or for "
                               "a CPU, which they add to - and the trace cannot tell which")
    elif load is not None:
        assumptions.append("the workers get CPU cores of their own, and the training's host work keeps its recorded "
                           "speed beside them (" + ("the host's cores are not recorded" if not cpus
                                                    else "the workers' CPU use is not recorded")
                           + "; workers competing with it for cores or memory bandwidth slow it)")
    assumptions.append("the per-batch loading cost stays what it was in the training process")
    # workers that cost the training nothing (cores, memory bandwidth) and enough of them: what the trace cannot check
    # makes the estimate only more optimistic
    upper = (floor == 0.0 and (load is None or not single or not cpus or comp_cpu is None)) or waiting
    return Plan(Edits(loader=fix, floor_step_ns=floor), "replay: DataLoader queue simulation", tuple(assumptions),
                {"num_workers": int(target) if target is not None else None, "prefetch_factor": prefetch,
                 "cpus": int(cpus) if cpus else None},
                bound="upper" if upper else None)


def _pinned_gbps(trace: RankTrace) -> tuple[float, str]:
    from kinetoscope.analyze.model.copies import h2d_copies

    h = h2d_copies(trace)
    big = h[h["pinned"].to_numpy() & (h["bytes"].fillna(0).to_numpy() >= 1 << 20)]
    if len(big) and big["dur_ns"].sum() > 0:
        return float(big["bytes"].sum() / big["dur_ns"].sum()), "measured on this trace's pinned copies"
    names = " ".join(str(p.get("name", "")) for p in trace.meta.device_properties)
    for pattern, gbps in PINNED_GBPS + ((PCIE3, PINNED_GBPS_DEFAULT),):
        found = pattern.search(names)
        if found:
            return gbps, f"typical for {found.group(0)}'s host link"
    return PINNED_GBPS_DEFAULT, "PCIe 3.0 x16 assumed: device family unknown"


def _h2d_ops(trace: RankTrace, g: ReplayGraph, pageable_only: bool) -> tuple[np.ndarray, pd.DataFrame]:
    from kinetoscope.analyze.model.copies import h2d_copies

    h = h2d_copies(trace)
    if pageable_only:
        h = h[(h["pageable"] | (h["host_memory"].eq("unknown") & h["blocking"])).to_numpy()]
    pos_of = pd.Series(np.arange(len(g.op_label)), index=g.op_label)
    idx = pos_of.reindex(h.index).dropna().to_numpy(np.int64)
    return idx, h


def _copy_items(g: ReplayGraph, ops: np.ndarray) -> set[int]:
    return {int(i) for i in np.flatnonzero(np.isin(g.it_await, ops) & (g.it_kind == "copy"))}


def plan_pageable(trace: RankTrace, g: ReplayGraph, params: dict[str, Any]) -> Plan | None:
    ops, h = _h2d_ops(trace, g, pageable_only=True)
    if not len(ops):
        return None
    gbps, why = _pinned_gbps(trace)
    gbps = float(params.get("pinned_gbps") or gbps)
    nbytes = h["bytes"].reindex(g.op_label[ops]).fillna(0).to_numpy(float)
    new = {
        int(j): int(min(g.op_dur[j], b / gbps)) if b > 0 else int(g.op_dur[j])
        for j, b in zip(ops, nbytes, strict=False)
    }
    free = _copy_items(g, ops)
    return Plan(Edits(item_free=free, op_dur=new), "replay: pinned copies",
                (f"pinned host memory copies at {gbps:.1f} GB/s ({why})",
                 "the copy call returns at once (non_blocking=True): the host no longer waits for it",
                 "the copy keeps its place in its stream (later kernels still wait for it)"))


def plan_overlap(trace: RankTrace, g: ReplayGraph, params: dict[str, Any]) -> Plan | None:
    ops, _ = _h2d_ops(trace, g, pageable_only=False)
    if not len(ops):
        return None
    return Plan(Edits(item_free=_copy_items(g, ops), op_dur={int(j): 0 for j in ops}), "replay: side-stream prefetch",
                ("each step's input copy runs on a side stream during the previous step (pinned, non_blocking), "
                 "so the compute stream no longer waits for it",
                 "the copy engine and host link have room for it beside the step's own traffic"))


def plan_syncs(trace: RankTrace, g: ReplayGraph, params: dict[str, Any]) -> Plan | None:
    every = int(params.get("every") or 10)
    copies_back = _window_items(g, "copy")
    copies_back = copies_back[g.it_dir[copies_back] == "DtoH"]  # .item(), .cpu(): a read-back the host waits for
    items = np.sort(np.concatenate([_window_items(g, "sync"), copies_back]))
    if not len(items):
        return Plan(Edits(), "replay: syncs removed",
                    ("no host-device sync in the window waits for the GPU (a CPU run, or syncs the GPU had finished "
                     "before): removing them saves nothing here",), {"every": every}, kind="syncs")
    step = np.searchsorted(g.step_start, g.it_start[items], side="right") - 1
    keep = (step % every) == every - 1
    return Plan(Edits(item_free={int(i) for i in items[~keep]}), "replay: syncs removed",
                (f"host-device syncs in the loop kept only every {every} steps (metrics read then)",
                 "the values they read are not needed to launch the next work (no data-dependent control flow)"),
                {"every": every}, kind="syncs")


def plan_respawn(trace: RankTrace, g: ReplayGraph, finding: Finding) -> Plan | None:
    items = _window_waits(g)
    if not len(items):
        return None
    waits = g.wait_end[items] - g.wait_start[items]
    typical = int(np.median(waits))
    long = waits >= max(2_000_000, 3 * typical)
    if not long.any():
        return None
    # shutting the old workers down and starting new ones also runs outside next(): untraced host time in the
    # steps where the start-up waits fall; what those steps spend outside their waits and outside the training
    # thread's traced operators, beyond a typical step, goes (was: all time outside the waits, so an evaluation
    # pass that started a new iterator - its forward traced - was worth 60 ms a step of a 222 ms one)
    step_of = np.clip(np.searchsorted(g.step_start, g.wait_start[items], side="right") - 1, 0, g.steps - 1)
    outside = _untraced_outside_waits(trace, g, items)
    typical_outside = float(np.median(outside))
    hit = sorted({int(x) for x in step_of[long]})
    extra = sum(max(outside[s_] - typical_outside, 0.0) for s_ in hit) / g.steps
    edits = Edits(
        item_dur=wait_edits(g, items[long], np.full(int(long.sum()), typical)), analytic_ns={"respawn": extra}
    )
    # that time is untraced: where those steps also hold other work than training - another loader's waits (a
    # validation pass), the capture's validation or checkpoint marks - that work's untraced hooks (a framework's
    # epoch end) share it and the trace cannot split them off: the saving is then a bound
    evaluation_at = set(trace.steps["start_ns"].to_numpy()[evaluation_steps(trace)].tolist())
    shared = extra > 0 and (_holds_other_work(trace, [(int(g.step_start[s_]), int(g.step_end[s_])) for s_ in hit])
                            or any(int(g.step_start[s_]) in evaluation_at for s_ in hit))  # an evaluation step
    return Plan(edits, "replay: persistent workers",
                (f"each worker start-up wait becomes a typical wait ({typical / 1e6:.2f} ms, the median)",
                 f"the time those {len(hit)} step(s) spend outside their waits beyond a typical step (worker shutdown "
                 f"and start, {extra * g.steps / 1e6:.1f} ms in all) goes too"
                 + (": all of it, though those steps also ran other work (validation, evaluation, a checkpoint) whose "
                    "untraced time shares it" if shared else "")),
                bound="upper" if shared else None,
                analytic_weights=tuple(1.0 if k in hit else 0.0 for k in range(g.steps)))


def _untraced_outside_waits(trace: RankTrace, g: ReplayGraph, items: np.ndarray) -> np.ndarray:
    """Per step of the graph, its time inside neither a data wait, an operator of the training thread, nor the
    capture's validation or checkpoint marks (ns): what those marks hold untraced is the validation's or the
    save's (a framework's hooks, a file copy), not the workers'."""
    ev = trace.events
    marks = ev[name_mask(ev, names=_OTHER_WORK_MARKS)]
    covered_s = [g.wait_start[items], marks["ts_ns"].to_numpy()]
    covered_e = [g.wait_end[items], marks["end_ns"].to_numpy()]
    tid = main_thread(trace)
    if tid is not None:
        ops = ev[kind_mask(ev, ("cpu_op",)) & _tid_mask(ev, {tid})]
        covered_s.append(ops["ts_ns"].to_numpy())
        covered_e.append(ops["end_ns"].to_numpy())
    covered = iv.union(np.concatenate(covered_s).astype(np.int64), np.concatenate(covered_e).astype(np.int64))
    steps_ns = (g.step_end - g.step_start).astype(float)
    return steps_ns - iv.overlap_each(g.step_start, g.step_end, covered).astype(float)


_OTHER_WORK_MARKS = frozenset({"kinetoscope::validation", "kinetoscope::checkpoint"})


def _holds_other_work(trace: RankTrace, spans: list[tuple[int, int]]) -> bool:
    """Whether any of ``spans`` overlaps another loader's waits or a validation or checkpoint mark."""
    ev = trace.events
    other = other_loader_spans(trace)
    marks = ev[name_mask(ev, names=_OTHER_WORK_MARKS)]
    starts = np.concatenate([other["ts_ns"].to_numpy(), marks["ts_ns"].to_numpy()])
    ends = np.concatenate([other["end_ns"].to_numpy(), marks["end_ns"].to_numpy()])
    return any(bool(((starts < hi) & (ends > lo)).any()) for lo, hi in spans)


def plan_from_measure(key: str, saving_ns_per_step: float, method: str, assumptions: tuple[str, ...],
                      bound: str | None = None) -> Plan:
    return Plan(Edits(analytic_ns={key: max(0.0, saving_ns_per_step)}), method, assumptions, bound=bound)


def _plan_gpu_idle(trace: RankTrace, g: ReplayGraph, finding: Finding, p: dict[str, Any]) -> Plan | None:
    """GPU idle stands for the fix of its main cause."""
    n = max(g.steps, 1)
    by_cause = finding.evidence.get("idle_by_cause_us") or {}
    cause = max(by_cause, key=lambda c: by_cause[c] or 0) if by_cause else None
    if cause == "data_wait":
        return plan_loader(trace, g, p)
    if cause == "sync":
        return plan_syncs(trace, g, p)
    if cause == "host_python" and by_cause.get("host_python"):
        return plan_from_measure("host_python", by_cause["host_python"] * 1000 / n,
                                 "measured: GPU idle while the training thread ran Python",
                                 ("the Python work the GPU waited for runs off the training thread (DataLoader "
                                  "workers, a background thread), overlapped with the GPU's work",), bound="upper")
    if cause == "host_launch" and by_cause.get("host_launch"):
        return plan_from_measure("launch", by_cause["host_launch"] * 1000 / n - GRAPH_REPLAY_NS,
                                 "measured: GPU idle waiting for launches",
                                 ("the GPU's idle time while the host launched work goes (CUDA graphs, fused "
                                  "ops), less one graph replay call per step",
                                  "the step can be captured as a graph or fused (static shapes, no host logic "
                                  "between its kernels): not something the trace can check"), bound="upper")
    return None


def _plan_launch_bound(trace: RankTrace, g: ReplayGraph, finding: Finding, p: dict[str, Any]) -> Plan | None:
    idle = finding.evidence.get("gpu_idle_waiting_for_launches_us")
    if idle is None:
        return None
    return plan_from_measure("launch", float(idle) * 1000 / max(g.steps, 1) - GRAPH_REPLAY_NS,
                             "measured: launch-bound idle",
                             ("under CUDA graphs the host launches each step's kernels in one call: the GPU's "
                              "idle time waiting for launches goes, less one replay call per step",
                              "the step's shapes are static (a graph replays fixed shapes)"), bound="upper")


def _plan_host_oversubscribed(trace: RankTrace, g: ReplayGraph, finding: Finding, p: dict[str, Any]) -> Plan | None:
    lost = finding.evidence.get("lost_us")
    if not lost:
        return None
    measured = finding.evidence.get("measured") is True
    bound = finding.evidence.get("saving_bound")
    return plan_from_measure(
        "host_cpu", float(lost) * 1000 / max(g.steps, 1),
        "measured: the training thread's run-queue wait (the kernel's scheduler statistics)" if measured
        else "inferred: work that ran without a core (CPU time against the time with work)",
        ("the training thread gets a CPU whenever it can run: the time it waited for one goes (what the other "
         "threads or processes then lose is not counted)",) + (
            ("on a rank with device work, host time lost behind the device's saves nothing",) if bound else ()),
        bound="upper" if bound == "upper" else None)


def _plan_allocator_churn(trace: RankTrace, g: ReplayGraph, finding: Finding, p: dict[str, Any]) -> Plan | None:
    held = finding.evidence.get("recurring_time_us")
    if not held:
        return None
    return plan_from_measure("allocator", float(held) * 1000 / max(g.steps, 1),
                             "measured: host time in device mallocs and frees",
                             ("the caching allocator keeps the memory between steps: the runtime calls, and the "
                              "device syncs the frees make, go",))


def cpu_room(trace: RankTrace) -> tuple[float, str] | None:
    """On a run without a GPU (collectives on the host: gloo): the share of a step its process's CPUs are idle, which
    is the most that overlapping its collectives with compute can take off a step - their CPU work (gloo's threads
    reduce and copy on the same cores) and the compute's stay, and cannot run faster than the rank's share of the
    host's cores allows. From the capture's process CPU time per step over the run (after the first step). Where
    every rank of the job runs on this host, at most the share of its cores its torch threads leave free while it
    computes. None where it is not recorded or the run has a GPU."""
    if trace.has_gpu:
        return None
    rs = trace.run_steps
    host, _ = _facts(trace)
    cpus = count(host.get("cpus"))
    if rs is None or "cpu_ns" not in rs or cpus is None:
        return None
    rs = rs.iloc[1:] if len(rs) > 2 else rs
    wall, cpu = rs["wall_ns"].to_numpy(float), rs["cpu_ns"].to_numpy(float)
    known = ~np.isnan(cpu) & ~np.isnan(wall)
    if not known.any() or float(wall[known].sum()) <= 0:
        return None
    ranks, ranks_said = _ranks_on_host(host, world_size(trace))
    together, said = _cores_together(host, cpus)
    cores = together / ranks
    busy = float(cpu[known].sum()) / cores / float(wall[known].sum())
    room = max(0.0, 1.0 - busy)
    share = f"{cores:.2f} of the host's {cpus} CPUs" if ranks > 1 else f"its {cpus} CPUs"
    said_all = said + (f"; {ranks_said}" if ranks_said else "")
    threads, world, here = count(host.get("torch_threads")), count(world_size(trace), 2), \
        count(host.get("ranks_on_host"))
    if threads is not None and world is not None and here is not None and here >= world:
        # every rank of the job on this host: its collectives move data through these CPUs (gloo's copies and
        # reductions, the kernel's loopback), so overlapped they run beside the compute only on cores the compute
        # leaves free - the idle time over a step sits in the collectives' own waits and latency, not beside the
        # compute (was: a step's idle share, so 2 ranks of 1 thread on 2 CPUs were told overlap would take 5-10%
        # off; smaller DDP buckets made such jobs no faster, most a few % slower)
        spare = max(0.0, cores - threads) / cores
        if spare < room:
            return spare, (f"overlapped, the collectives' CPU work runs beside the compute's: the job's ranks all "
                           f"run on this host, each computing on {threads} torch thread(s) of {share} ({said_all}), "
                           "so " + ("no core is" if spare == 0 else f"{spare:.0%} of its cores are")
                           + f" free while it computes: a step can be {spare:.0%} shorter at most")
    return room, (f"overlapped, the collectives' CPU work and the compute's stay: the process uses {busy:.0%} of "
                  f"{share} through a step over the run (capture: process CPU time; {said_all}"
                  f"), so a step can be {room:.0%} shorter at most")


def _plan_exposed_comm(trace: RankTrace, g: ReplayGraph, finding: Finding, p: dict[str, Any]) -> Plan | None:
    ev = finding.evidence
    exposed = ev.get("exposed_us")
    if exposed is None:
        return None
    per_step_ns = float(exposed) * 1000 / max(g.steps, 1)
    details: dict[str, Any] = {}
    room = cpu_room(trace)
    # a CPU run (gloo): overlap cannot give more than the CPUs have free (was: the whole exposure, so a rank busy on its
    # CPU 95% of its step was told overlap would take 7% of its window off)
    cap_ns = room[0] * float((g.step_end - g.step_start).mean()) if room is not None and g.steps else None
    if cap_ns is not None:
        details = {"exposed_us_per_step": round(per_step_ns / 1000, 3), "cpu_room_us_per_step": round(cap_ns / 1000, 3)}
    # FSDP on a host its ranks fill, whose state fits each rank many times over: replicating (DDP) takes FSDP's own
    # time on the training thread away (its all-gathers, reduce-scatters, hooks and copies) for one bucketed
    # all-reduce; the rank's waits for later ranks (where the job's matching has told them) stay (was: overlap only,
    # worth nothing with no core free; six FSDP2 programs on 2 ranks of one 2-CPU host ran 31-42% faster as DDP,
    # where FSDP's own spans held 25-39% of their profiled windows)
    sharding = ev.get("sharding_us") if ev.get("replicate_instead") and g.steps else None
    sharding_ns = float(sharding) * 1000 / g.steps if sharding else None
    waits_ns = float(ev.get("waiting_for_other_ranks_us") or 0.0) * 1000 / max(g.steps, 1)
    fix = comm_fix(per_step_ns, cap_ns, room[1] if room is not None else None, sharding_ns, waits_ns,
                   str(ev.get("replicate_why")))
    if sharding_ns is not None:
        details.setdefault("exposed_us_per_step", round(per_step_ns / 1000, 3))
        details.update(sharding_us_per_step=round(sharding_ns / 1000, 3),
                       replicate_us_per_step=round(max(sharding_ns - waits_ns, 0.0) / 1000, 3))
        if room is not None and cap_ns is not None and cap_ns < per_step_ns:
            details["overlap_limited_by"] = room[1]  # the report chooses again once the job's waits are known
    if fix.limited_by is not None:
        details["limited_by"] = fix.limited_by
    plan = plan_from_measure("comm", fix.saving, fix.method, fix.assumptions, bound=fix.bound)
    if details:
        plan = replace(plan, extra=details)
    # the saving lies in the steps that hold the exposure (an epoch's end with a test pass's collectives)
    by_step = finding.extra.get("exposed_ns_by_step")
    if by_step and g.steps:
        at = np.asarray([t for t, _ in by_step], dtype=np.int64)
        ns = np.asarray([x for _, x in by_step], dtype=np.float64)
        k = np.searchsorted(g.step_start, at, side="right") - 1
        inside = (k >= 0) & (at < g.step_end[np.clip(k, 0, g.steps - 1)])
        weights = np.bincount(k[inside], weights=ns[inside], minlength=g.steps)[:g.steps]
        if weights.sum() > 0:
            plan = replace(plan, analytic_weights=tuple(float(x) for x in weights))
    return plan


def _plan_pipeline_bubble(trace: RankTrace, g: ReplayGraph, finding: Finding, p: dict[str, Any]) -> Plan | None:
    """The stage's send/recv kernels take no time: it never waits for its neighbours (on the host, its measured
    bubble goes)."""
    assumption = ("the stage's neighbours never keep it waiting (a schedule with fewer bubbles, balanced stages): "
                  "the bound of what it gains; their own work and the schedule's warm-up bound it too, which one "
                  "rank's trace does not show")
    if finding.evidence.get("where") == "gpu":
        coll = collective_roles(trace)
        labels = coll.index[(coll["role"] == "pipeline").to_numpy()] if len(coll) else coll.index
        pos = pd.Series(np.arange(len(g.op_label)), index=g.op_label)
        ops = pos.reindex(labels).dropna().astype(np.int64).to_numpy()
        if not len(ops):
            return None
        return Plan(Edits(op_dur={int(j): 0 for j in ops}), "replay: the stage's send/recv kernels take no time",
                    (assumption,), bound="upper", kind="comm")
    bubble = finding.evidence.get("bubble_us_per_step")
    if bubble is None:
        return None
    return plan_from_measure("comm", float(bubble) * 1000, "measured: the stage's bubble", (assumption,),
                             bound="upper")


def _plan_recompile(trace: RankTrace, g: ReplayGraph, finding: Finding, p: dict[str, Any]) -> Plan | None:
    ns = float(finding.evidence.get("compile_time_us") or 0) * 1000
    return plan_from_measure("compile", ns / max(g.steps, 1), "measured: compile time",
                             ("compilation inside the window no longer happens (shapes made static or dynamic)",))


def _plan_straggler(trace: RankTrace, g: ReplayGraph, finding: Finding, p: dict[str, Any]) -> Plan | None:
    ev = finding.evidence
    if ev.get("cause") == "uneven_steps":  # its extra steps run after the window's: worth what the run timed
        return None
    excess = ev.get("cause_excess_us_per_step")
    known = ev.get("cause") != "unknown" and excess is not None
    n = straggler_shards(ev)
    work = ("validation sharded" if ev.get("cause") == "validation"
            else "work of its own (the trace shows it doing alone) shared")
    cause = (f"rank {ev.get('rank')}'s {work} across its group's {n} ranks: the others' waits for it at "
             f"collectives shrink by its lateness, at most its measured excess, and every rank then runs its 1/{n} "
             "share of it, which stays in the step" if n else
             f"rank {ev.get('rank')}'s cause ({ev.get('cause')}) removed: the others' waits for it at collectives "
             "shrink by its lateness" + (", at most its measured excess" if known else
                                         " (its cause is not in the trace: the others' whole wait, at most)"))
    share = ev.get("run_keeps_share_of_window_excess")
    kept = float(share) if share is not None else 1.0
    scaled = kept < 1.0
    if scaled:
        # the run's ordinary steps keep less of its extra CPU than the window shows: that share of it is the run's
        cpu = ev.get("lateness_cpu_share")
        cause += (f", scaled by the share of its extra CPU in the profiled steps that the run's ordinary unprofiled "
                  f"steps keep ({kept:.0%}: the rest of its lateness in the window is the profiler's, or CPU time lost "
                  "to contention)"
                  + (f"; the part of its lateness its CPU does not explain ({1 - float(cpu):.0%}) is taken to scale "
                     "alike: the trace cannot show it outside the window"
                     if cpu is not None and float(cpu) < 1 else ""))
    method = "measured: collective waits" + (", scaled by the run's unprofiled steps" if scaled else "")
    plan = plan_from_measure("straggler", straggler_saving_us(ev) * 1000, method, (cause,),
                             bound=None if known else "upper")
    # the saving lies where the others waited: by the straggler's own step holding each late arrival
    late = finding.extra.get("late_arrivals_ns")
    if late and g.steps:
        at = np.asarray([t for t, _ in late], dtype=np.int64)
        waits = np.asarray([w for _, w in late], dtype=np.float64)
        k = np.searchsorted(g.step_start, at, side="right") - 1
        inside = (k >= 0) & (at < g.step_end[np.clip(k, 0, g.steps - 1)])
        weights = np.bincount(k[inside], weights=waits[inside], minlength=g.steps)[:g.steps]
        if weights.sum() > 0:
            plan = replace(plan, analytic_weights=tuple(float(x) for x in weights))
    return plan


PlanFn = Callable[[RankTrace, ReplayGraph, Finding, dict[str, Any]], "Plan | None"]
#: a fix's parameter: (kind, smallest allowed value, what it means)
Param = tuple[type, float, str]


@dataclass(frozen=True)
class Fix:
    """What fixing one kind of finding means, in one place."""

    #: the finding id it fixes
    finding_id: str
    #: the edit of the replay that fixes it, ``(trace, graph, finding, params) -> Plan | None``; None where the
    #: finding is not a time cost (``no_time_cost`` says why) or has no fix the replay or a measure can express
    plan: PlanFn | None = None
    #: what the fix edits: two findings whose fixes edit the same thing are one fix when applied together (the
    #: first named wins); None: what its plan edits (``Plan.what``), else the finding's own id
    edits: str | None = None
    #: the parameters it takes, by name
    params: dict[str, Param] = field(default_factory=dict)
    #: the findings whose fix this one stands for: it takes their parameters too
    stands_for: tuple[str, ...] = ()
    #: why fixing it saves no time (a correctness fix, or one that keeps the job alive); None for a time cost
    no_time_cost: str | None = None


_LOADER_PARAMS: dict[str, Param] = {"num_workers": (int, 1, "DataLoader workers after the fix"),
                                    "prefetch_factor": (int, 1, "batches each worker prepares ahead"),
                                    "handoff_ms": (float, 0.0, "what taking a ready batch costs the loop")}
_SYNC_PARAMS: dict[str, Param] = {"every": (int, 1, "keep one sync every this many steps")}
_KEEPS_ALIVE = "no time saving: the fix keeps the job alive (steps until out of memory below)"
_CORRECTNESS = "a correctness fix: no time saving expected"

#: every finding's fix, by finding id (a finding not here has no estimate)
FIXES: dict[str, Fix] = {f.finding_id: f for f in (
    Fix("loader_stall", lambda t, g, f, p: plan_loader(t, g, p), edits="loader", params=_LOADER_PARAMS),
    Fix("h2d_pageable", lambda t, g, f, p: plan_pageable(t, g, p),
        params={"pinned_gbps": (float, 1e-3, "host-to-device bandwidth from pinned memory")}),
    Fix("h2d_not_overlapped", lambda t, g, f, p: plan_overlap(t, g, p)),
    Fix("sync_in_loop", lambda t, g, f, p: plan_syncs(t, g, p), edits="syncs", params=_SYNC_PARAMS),
    Fix("sync_point", lambda t, g, f, p: plan_syncs(t, g, p), edits="syncs", params=_SYNC_PARAMS),
    Fix("worker_respawn", lambda t, g, f, p: plan_respawn(t, g, f), edits="respawn"),
    Fix("gpu_idle", _plan_gpu_idle, params={**_LOADER_PARAMS, **_SYNC_PARAMS},
        stands_for=("sync_in_loop", "sync_point", "loader_stall")),
    Fix("launch_bound", _plan_launch_bound, edits="launch"),
    Fix("host_oversubscribed", _plan_host_oversubscribed),
    Fix("allocator_churn", _plan_allocator_churn),
    Fix("exposed_comm", _plan_exposed_comm, edits="comm"),
    Fix("pipeline_bubble", _plan_pipeline_bubble, edits="comm"),
    Fix("recompile", _plan_recompile),
    Fix("straggler", _plan_straggler),
    Fix("memory_growth", no_time_cost=_KEEPS_ALIVE),
    Fix("reserved_memory_growth", no_time_cost=_KEEPS_ALIVE),
    Fix("zero_grad_missing", no_time_cost=_CORRECTNESS),
    Fix("optimizer_step_mismatch", no_time_cost=_CORRECTNESS),
    Fix("no_backward", no_time_cost=_CORRECTNESS),
)}
#: parameters each fix takes (the fixes that take any), by finding id
PARAMS: dict[str, dict[str, Param]] = {fid: fix.params for fid, fix in FIXES.items() if fix.params}


def plan_for(trace: RankTrace, g: ReplayGraph, finding: Finding, params: dict[str, Any] | None = None) -> Plan | None:
    """The edit that fixes ``finding``, or None where this finding is not a time cost (or nothing to edit)."""
    fix = FIXES.get(finding.id)
    if fix is None or fix.plan is None:
        return None
    return fix.plan(trace, g, finding, params or {})


def edited_by(finding: Finding, plan: Plan) -> str:
    """What fixing ``finding`` with ``plan`` edits: two fixes that edit the same thing are one fix."""
    fix = FIXES.get(finding.id)
    return (fix.edits if fix is not None else None) or plan.what or finding.id


def straggler_saving_us(evidence: dict[str, Any]) -> float:
    """What fixing the straggler's cause gives the others per step (us): their wait for it, at most the straggler's
    measured excess in that cause; a validation only it runs is sharded across its group (``group_size`` ranks,
    the advice), which keeps each rank's 1/n share of it in the step. Where its lateness is its CPU and the capture
    timed the run's other steps, scaled by the share of its extra CPU in the window those keep
    (``run_keeps_share_of_window_excess``): the rest of its lateness in the window is the profiler's. The one place
    ``analyze`` and ``batch`` price it."""
    kept = evidence.get("run_keeps_share_of_window_excess")
    saving = _uncapped_saving_us(evidence)
    return saving * min(max(float(kept), 0.0), 1.0) if kept is not None else saving


def _uncapped_saving_us(evidence: dict[str, Any]) -> float:
    wait = float(evidence.get("others_wait_us_per_step") or 0)
    excess = evidence.get("cause_excess_us_per_step")
    if evidence.get("cause") == "unknown" or excess is None:  # what explains it is not in the trace: its whole wait
        return wait
    saving = min(wait, float(excess))
    n = straggler_shards(evidence)
    # validation sharded across the group (the advice): the straggler runs 1/n of it and so does every other rank,
    # so the others' wait shrinks by its lateness and the step keeps 1/n of it (was: all of it removed, so a 2-rank
    # job was told twice what sharding gives - critical at 31% of the run where it gives about half)
    return max(saving - float(excess) / n, 0.0) if n else saving


def straggler_shards(evidence: dict[str, Any]) -> int | None:
    """The ranks a straggler's validation, or work of its own the trace shows it doing alone, would be shared across
    (its group's size); None where it is neither, or the size is not known."""
    n = count(evidence.get("group_size"), 2)
    # validation, or work of its own the trace shows it doing alone: the advice shares it across the group
    return n if evidence.get("cause") == "validation" or evidence.get("extra_work_steps") else None


def params_for(fid: str, params: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    """A fix's parameters; a fix that stands for others (gpu_idle, for its main cause's) takes theirs too."""
    params = params or {}
    fix = FIXES.get(fid)
    out: dict[str, Any] = {}
    for other in fix.stands_for if fix is not None else ():
        out.update(params.get(other, {}))
    return {**out, **params.get(fid, {})}


def check_params(params: dict[str, dict[str, Any]]) -> list[str]:
    """What is wrong with fix parameters (unknown fix or key, not a finite number, a fraction where a count
    is needed, below the smallest allowed value); empty when they are fine."""
    problems = []
    for fid, values in params.items():
        known = PARAMS.get(fid)
        if known is None:
            problems.append(f"{fid} takes no parameters (these do: {', '.join(sorted(PARAMS))})")
            continue
        for key, value in values.items():
            if key not in known:
                problems.append(f"{fid}.{key}: unknown (known: {', '.join(sorted(known))})")
                continue
            kind, low, _ = known[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                problems.append(f"{fid}.{key}={value!r}: not a finite number")
            elif kind is int and value != int(value):
                problems.append(f"{fid}.{key}={value!r}: must be a whole number")
            elif value < low:
                problems.append(f"{fid}.{key}={value!r}: must be at least {low:g}")
    return problems

