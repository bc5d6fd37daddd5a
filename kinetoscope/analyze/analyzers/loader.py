"""Loader stalls: time the training loop waits in ``next(DataLoader)``."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.hostfacts import no_core_for_a_worker
from kinetoscope.analyze.model.missing import missing_activity
from kinetoscope.analyze.model.phases import evaluation_waits
from kinetoscope.analyze.model.results import Loader, LoaderResult, LoaderRun
from kinetoscope.analyze.model.timeline import (
    HANDOVER_CPU_SHARE,
    WORKERS_BUSY_MIN_SHARE,
    any_gpu_busy,
    batch_at_once,
    handoff_ns,
    handover_waits,
    in_memory_dataset,
    intervals_of,
    loader_spans,
    main_thread,
    other_loader_spans,
    other_role_waits,
    per_item_batch,
    probed_handover_ns,
    python_judged,
    stall_time_share,
    transforms_judged,
    wait_cpu_share,
    waits_as_probed,
    window,
    workers_busy_share,
)
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import frac, us


def _per_step(trace: RankTrace, spans: iv.Intervals, idle_cost: iv.Intervals | None) -> pd.DataFrame:
    steps = trace.steps
    if steps.empty:
        return pd.DataFrame(columns=["step", "step_us", "loader_us", "loader_fraction", "gpu_idle_cost_us"])
    s, e = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    loader_ns = iv.overlap_each(s, e, spans)
    out = pd.DataFrame(
        {
            "step": steps["step"].to_numpy(),
            "step_us": steps["dur_ns"].to_numpy() / 1000.0,
            "loader_us": loader_ns / 1000.0,
            "loader_fraction": np.where(steps["dur_ns"] > 0, loader_ns / np.maximum(steps["dur_ns"], 1), 0.0),
        }
    )
    out["gpu_idle_cost_us"] = iv.overlap_each(s, e, idle_cost) / 1000.0 if idle_cost is not None else np.nan
    return out




def wait_kind(trace: RankTrace, waits_ns: np.ndarray) -> tuple[str, float | None, bool]:
    """Why the loop waits for batches from worker processes: "handover" (taking each batch over: the loop itself works
    through the wait, or the waits are what the capture's probe measured a ready batch's hand-over to cost on this
    host - ``timeline.handover_waits``), "starved" (it sits idle while the workers prepare batches), "idle_workers"
    (it sits idle and so, mostly, do the workers: they wait for something the trace does not show), or "unknown"; the
    loop's CPU share during the waits, from the capture's per-step CPU times (None where not recorded); and whether
    that share is the training thread's own (else the process's, every thread's)."""
    load_cpu, own = wait_cpu_share(trace)
    if handover_waits(trace, waits_ns):  # the one test the replay uses too
        return "handover", load_cpu, own
    if load_cpu is not None:
        # starved: the workers fall behind - busy, or mostly waiting themselves ("idle_workers": each batch takes a
        # worker num_workers steps in the steady state, of which its CPU is under a quarter)
        busy = workers_busy_share(trace)
        if busy is not None and busy < WORKERS_BUSY_MIN_SHARE:
            return "idle_workers", load_cpu, own
        return "starved", load_cpu, own
    handoff = handoff_ns(waits_ns)
    if handoff and stall_time_share(waits_ns, handoff) < 0.25:  # ready batches, little time in stalls
        return "handover", None, False
    return "unknown", None, False


def _recommendation(names: set[str], pageable_h2d: bool, first_step_share: float, gpu: bool, kind: str,
                    wait_cpu: float | None, cpus: int | None, per_item: str | None = None, own_cpu: bool = False,
                    at_once: str | None = None, dataset: str | None = None, probed: str | None = None,
                    no_core: bool = False, dearer_handover: str | None = None) -> str:
    tips = []
    if at_once == "tensor_rows":
        tips.append(
            "the workers serve a TensorDataset, whose items are rows of tensors already in memory: index the whole "
            "batch at once in the training process (num_workers=0, and a BatchSampler as the DataLoader's sampler "
            "with batch_size=None, or slice the tensors yourself) - no per-item work, no worker, no hand-over")
    elif at_once == "custom":
        tips.append(
            f"the dataset ({dataset or 'its class'}) holds its items as tensors in memory: if its __getitem__'s "
            "per-item work can be done on a whole batch at once, index and transform the batch in the training "
            "process (num_workers=0) and the hand-over goes with the workers (what that work costs there is not "
            "known: the estimate, every wait removed, is a bound)")
    if per_item == "indexing":
        tips.append(
            "each batch is built item by item from tensors in memory (a TensorDataset's __getitem__ per item, then "
            "torch.stack): index the whole batch at once - pass a BatchSampler as the DataLoader's sampler with "
            "batch_size=None, or slice the tensors yourself - which removes the per-item work rather than moving it "
            "to workers")
    elif per_item == "tensor_ops":
        tips.append(
            "each batch is built item by item: rows of tensors in memory indexed, then worked on by torch's operators "
            "one item at a time (what the trace shows inside the waits): do it on the whole batch at once - index the "
            "rows with the batch's indices (a BatchSampler as the DataLoader's sampler with batch_size=None, or a "
            "__getitems__ on the dataset) and apply the same operators to the batch - which removes the per-item "
            "calls rather than moving them to workers")
    elif per_item == "transforms":
        tips.append(
            "each batch is built item by item: every item converted from what the dataset holds in memory, one at a "
            "time (torch's operators called once per item inside the waits, the Python around them in the rest): do "
            "the fixed conversions once for the whole dataset (to a tensor, normalised, stored), and apply any random "
            "augmentation to the whole batch at once - which removes the per-item work rather than moving it to "
            "workers")
    elif per_item == "python":
        tips.append(
            "each batch is built item by item in the training thread by the Dataset's __getitem__, in work the trace "
            "does not show as torch's (Python: parsing, tokenising, building lists and small tensors; or a library's "
            "C code): do what is the same every epoch once for the whole dataset (parse or tokenise it up front, "
            "vectorised, and keep the tensors), and what is not on the whole batch at once (a __getitems__ on the "
            "dataset, or a collate_fn) - which removes the per-item calls rather than moving them to a worker (what "
            "that work costs done at once is not in the trace: the estimate, every wait but the collate's removed, is "
            "a bound)")
    multiprocess = any("MultiProcessing" in n for n in names)
    if at_once == "tensor_rows":
        pass  # no workers after the fix: nothing of theirs to tune
    elif per_item is not None and no_core:
        pass  # no core is left for a worker (the capture's host facts): the batch built at once is the fix
    elif dearer_handover is not None and any("SingleProcess" in n for n in names):
        # a worker would cost the loop more to take each batch from than building it costs now: not advised (was:
        # "set num_workers" beside a replay of a worker that gained nothing, on a LeNet loop whose 0.7 ms waits a
        # worker's 1.37 ms hand-over, probed on the host, would have made longer)
        tips.append(f"DataLoader workers would not help: {dearer_handover}")
    elif any("SingleProcess" in n for n in names):
        tips.append(
            "the DataLoader runs in the training process (num_workers=0): set num_workers to the "
            + ("number of free CPU cores (e.g. 4-8 per GPU)" if gpu else "number of CPU cores the training leaves free")
            + (f" (this host has {cpus})" if cpus else "") + " so batches are prepared in parallel"
        )
    elif multiprocess and kind == "handover":
        tips.append(
            "the workers keep up: the loop's wait is taking each batch over from them ("
            + (f"the {'training thread' if own_cpu else 'process'}'s CPU is busy {wait_cpu:.0%} of the wait"
               if wait_cpu is not None and wait_cpu >= HANDOVER_CPU_SHARE
               else probed if probed
               else "the waits are alike and short, batches were ready")
            + "), so more workers will not help: make batches cheaper to hand over (a few large tensors rather than "
              "many small ones or Python objects, a smaller dtype, collate in the workers)"
        )
    elif multiprocess and kind == "idle_workers":
        tips.append(
            "the loop waits for the workers" + (f" (it sits idle through {1 - wait_cpu:.0%} of its waits)"
                                                 if wait_cpu is not None else "")
            + ", but they are not busy either: their CPU is under a quarter of the time each batch takes them, so "
              "they wait themselves - for storage or the network (more workers or a larger prefetch_factor overlap "
              "that), or for a CPU on a busy host (more workers add to it: see host_oversubscribed"
            + (f"; this host has {cpus} CPUs" if cpus else "") + "). Find which before raising num_workers"
        )
    elif multiprocess:
        tips.append(
            ("the worker processes cannot keep up" + (f" (the loop sits idle through {1 - wait_cpu:.0%} of its waits)"
                                                      if wait_cpu is not None else "")
             if kind == "starved" else
             "the loop waits for the workers (whether they fall behind or the hand-over costs this much cannot be told "
             "without the capture's CPU times: run under kinetoscope capture)")
            + ": raise num_workers" + (f" (this host has {cpus} CPUs)" if cpus else "")
            + ", raise prefetch_factor (default 2), and make the Dataset's __getitem__ cheaper ("
            + ("decode/augment on the GPU, " if gpu else "") + "cache preprocessed data)"
        )
    else:
        tips.append("the input pipeline cannot keep up: parallelise it and prefetch batches ahead of the step")
    if multiprocess and first_step_share > 0.5 and at_once is None:
        tips.append("most of the wait is in the first step: set persistent_workers=True so workers survive epochs")
    if pageable_h2d:
        tips.append("set pin_memory=True and copy with .to(device, non_blocking=True)")
    return "; ".join(tips) + "."


def _recorded_sum(rs: pd.DataFrame, column: str) -> float | None:
    """A steps.json list's total, None where the capture did not record it."""
    if column not in rs or rs[column].isna().all():
        return None
    return float(rs[column].astype(float).sum())


def _whole_run(trace: RankTrace, window_wait_ns: int) -> LoaderRun | None:
    """Data wait over every step of the run, from the capture's host clocks (not only profiled steps): the
    training loader's where the capture told loaders apart, with validation apart; None where not recorded."""
    rs = trace.run_steps
    if rs is None or rs.empty:
        return None
    wall = int(rs["wall_ns"].sum())
    train = _recorded_sum(rs, "train_data_wait_ns")
    # without the training loader's own waits (a loader that trained ended "unknown"): every wait less the
    # evaluation's - where the capture split each wait by its batch (loop marks 3), less each step's evaluation
    # waits; before, less the steps that hold validation, whose waits are mostly the evaluation's (was: an Ignite
    # run's evaluator over the training loader read as the loop's wait)
    loop = (trace.meta.capture or {}).get("loop") or {}
    version = loop.get("marks")
    split = (train is None and isinstance(version, int) and version >= 3 and "eval_data_wait_ns" in rs
             and not rs["eval_data_wait_ns"].isna().any())
    in_validation = (rs["validation_ns"].fillna(0).to_numpy(np.float64) > 0
                     if train is None and not split and "validation_ns" in rs else np.zeros(len(rs), dtype=bool))
    per_step = rs["data_wait_ns"].to_numpy(np.float64) - (
        rs["eval_data_wait_ns"].to_numpy(np.float64) if split else 0.0)
    left_out = int(in_validation.sum())
    wait: float | None = (train if train is not None
                          else None if left_out == len(rs)
                          else float(np.clip(per_step[~in_validation], 0, None).sum()))
    recorded = loop.get("recorded")
    # a capture that timed no waits (the Profiler API before it recorded them) reads 0 beside waits in its trace:
    # that 0 is not a measurement
    if (not wait and window_wait_ns > 0 and (recorded is None or "data_wait" not in recorded)):
        wait = None
    validation = _recorded_sum(rs, "validation_ns")
    eval_wait = _recorded_sum(rs, "eval_data_wait_ns")
    # each worker start's first batch waits for the workers to come up (worker_respawn's cost, or start-up): the
    # steps' longest waits, as many as the capture counted starts, are left out of what a loader fix acts on (was:
    # a Fabric job's train waits, 6.9% of its run, 4.7 of it the first batches after its restarts: two readers
    # judged the 2.2% left, info)
    starts = (loop.get("workers") or {}).get("starts") if "workers" in (recorded or ()) else 0
    recurring = None
    # where steps were left out, a worker start may lie in one: which waits are starts is not known
    if wait is not None and isinstance(starts, int) and not (left_out and starts):
        waits = (rs["train_data_wait_ns"].fillna(0).to_numpy(np.float64) if train is not None
                 else np.clip(per_step[~in_validation], 0, None))
        longest = np.sort(waits)[::-1][:starts]
        recurring = wait - float(longest.sum())
    return LoaderRun(
        steps=int(len(rs)),
        wall_us=us(wall),
        data_wait_us=us(wait),
        data_wait_fraction=frac(wait, wall),
        data_wait_of=("the training loader's waits (the capture told loaders apart)" if train is not None
                      else "not recorded by this capture" if wait is None and not left_out
                      else "not known: every step holds validation" if wait is None
                      else "every DataLoader wait on the training thread less the batches the capture saw taken for "
                           "evaluation" if split
                      else f"every DataLoader wait on the training thread, less the {left_out} step"
                           f"{'s' if left_out != 1 else ''} holding validation (their training waits too: a lower "
                           "bound)" if left_out
                      else "every DataLoader wait on the training thread"),
        validation_us=us(validation),
        validation_fraction=frac(validation, wall),
        eval_data_wait_us=us(eval_wait),
        fraction_of="wall time of every step of the run (host clocks)",
        mean_step_us=us(wall / len(rs)),
        recurring_wait_us=us(recurring),
        recurring_wait_fraction=frac(recurring, wall),
        recurring_wait_of=(f"the same, less the {starts} longest: the first batch after each of the {starts} worker "
                           "start(s) the capture counted" if starts else "the same: no worker starts counted")
        if recurring is not None else None,
    )


def _split_evaluation_waits(trace: RankTrace, frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the training loop's waits, the evaluation's) in a trace without the capture's marks
    (``phases.evaluation_waits``: waits in steps that run no backward or optimizer among steps that train, and
    waits no backward pass follows - a validation pass inside a training step; was: a plain-profiler trace's 71.6 ms
    of validation waits in one step were the training loop's, 80% of its window, critical)."""
    if frame.empty:
        return frame, frame.iloc[0:0]
    in_eval = evaluation_waits(trace, frame["ts_ns"].to_numpy(), frame["end_ns"].to_numpy())
    return frame[~in_eval], frame[in_eval]


@register("loader", "Loader stalls")
def analyze_loader(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Time in enumerate(DataLoader)/DataPipe spans, per step and in total, and the GPU idle it caused."""
    w = window(trace)
    frame = loader_spans(trace)
    inferred_eval = frame.iloc[0:0]
    if not len(trace.marks):  # without the capture's loader roles: a wait in an evaluation step is evaluation
        frame, inferred_eval = _split_evaluation_waits(trace, frame)
    spans = intervals_of(frame, w)
    loader_ns = iv.measure(spans)
    others = other_loader_spans(trace)  # on other threads (a prefetcher); a validation loader's are counted apart
    others = others[others["tid"].astype(str).to_numpy() != str(main_thread(trace))]
    other_ns = iv.measure(intervals_of(others, w))
    eval_ns = iv.measure(intervals_of(other_role_waits(trace) if len(trace.marks) else inferred_eval, w))
    # the GPU's idle during the wait, where the trace shows what the GPU did
    has_gpu = trace.has_gpu and missing_activity(trace).blind_ns() <= config.missing_activity_max_fraction * w.dur_ns
    idle_cost = iv.subtract(spans, any_gpu_busy(trace)) if has_gpu else None
    cost_ns = iv.measure(idle_cost) if idle_cost is not None else None
    per_step = _per_step(trace, spans, idle_cost)
    names = set(frame["name"].astype(str).unique())
    metrics = Loader(
        time_us=us(loader_ns),
        fraction=frac(loader_ns, w.dur_ns),
        fraction_of="window",
        calls=int(len(frame)),
        gpu_idle_cost_us=us(cost_ns),
        gpu_idle_cost_fraction=frac(cost_ns, w.dur_ns) if cost_ns is not None else None,
        iterator=sorted(n.split("#", 1)[-1] for n in names),
        thread=main_thread(trace) if len(frame) else None,
        other_threads_us=us(other_ns),
        other_threads_calls=int(len(others)),
        eval_loader_wait_us=us(eval_ns) if len(trace.marks) or len(inferred_eval) else None,
        eval_loader_wait_basis=("capture marks" if len(trace.marks) else "inferred" if len(inferred_eval) else None),
        max_step_us=float(per_step["loader_us"].max()) if len(per_step) else None,
        run=_whole_run(trace, loader_ns),
    )
    findings = []
    # On a GPU run what matters is the GPU time the wait cost (a prefetched
    # pipeline overlaps it with compute); on a CPU-only run, the wait itself.
    basis_ns = cost_ns if cost_ns is not None else loader_ns
    share = basis_ns / w.dur_ns if w.dur_ns else 0.0
    # on a CPU run the wait is the cost, and where the capture timed the training loader's waits over every step of
    # the run, a share of the run as large as the bar (less each worker start's first batch) is a stall too, and its
    # worth is judged over the run (was: the
    # window's share alone, whose steps the profiler slows: makemore's transformer waited 10.8% of its run, 4.9% of
    # its window; two readers: warning)
    run = metrics.run
    over_run = cost_ns is None and run is not None and run.recurring_wait_fraction is not None
    gate = max(share, run.recurring_wait_fraction or 0.0) if over_run and run is not None else share
    in_window = int(((frame["end_ns"] > w.start_ns) & (frame["ts_ns"] < w.end_ns)).sum())
    if in_window >= 2 and gate >= config.loader_min_fraction:
        from kinetoscope.analyze.model.copies import h2d_copies

        pageable = bool(h2d_copies(trace)["pageable"].any()) if has_gpu else False
        kind, wait_cpu, own_cpu = wait_kind(trace, frame["dur_ns"].to_numpy())
        built = per_item_batch(trace, frame["ts_ns"].to_numpy(np.int64), frame["end_ns"].to_numpy(np.int64))
        per_item = built[0] if built is not None else None
        no_core = no_core_for_a_worker(trace)
        in_memory = in_memory_dataset(trace) if any("MultiProcessing" in n for n in names) else None
        probe_ns = probed_handover_ns(trace)
        probed = (f"its waits, median {float(np.median(frame['dur_ns'])) / 1e6:.2f} ms, are what the capture measured "
                  f"a ready batch's hand-over to cost on this host, {probe_ns / 1e6:.2f} ms"
                  if probe_ns and waits_as_probed(trace, frame["dur_ns"].to_numpy()) else None)
        # against the waits' mean: a worker prefetching ahead also absorbs the rare long wait, which the queue replay
        # credits (was: the median, so 0.5 ms waits with a 60 ms one in five were told workers would not help beside a
        # worker replay worth 12%)
        mean_wait_ns = float(np.mean(frame["dur_ns"]))
        dearer = (f"taking a batch from one costs {probe_ns / 1e6:.2f} ms on this host (the capture's probe), more "
                  f"than building it in the training process, {mean_wait_ns / 1e6:.2f} ms (the waits' mean)"
                  if probe_ns and probe_ns >= mean_wait_ns and not any("MultiProcessing" in n for n in names)
                  else None)
        # the workers' dataset priced as the batch indexed at once (whatif.fixes.plan_loader: the same test)
        at_once = batch_at_once(trace, frame["dur_ns"].to_numpy()) if in_memory is not None else None
        dataset = ((trace.meta.capture or {}).get("dataloader") or {}).get("dataset_class")
        cpus = (trace.meta.capture.get("host") or {}).get("cpus")
        # worker start-up shows as a long first wait; it needs several steps to tell apart
        first = (per_step["loader_us"].iloc[0] / per_step["loader_us"].sum()
                 if len(per_step) >= 3 and per_step["loader_us"].sum() else 0.0)
        worst = per_step.sort_values("loader_us", ascending=False).head(3)
        waits = per_step["loader_us"]
        typical = (f"; the training loop waits {waits.mean() / 1000:.1f} ms per step for data "
                   f"(median {waits.median() / 1000:.1f} ms)" if len(waits) else "")
        window_text = f"the {w.dur_ns / 1e6:.1f} ms window"
        title = (f"DataLoader stalls cost {share:.0%} of {window_text} in GPU idle time{typical}" if cost_ns is not None
                 else f"Data loading takes {share:.0%} of {window_text}{typical}")
        findings.append(
            Finding(
                id="loader_stall",
                rank=trace.rank,
                title=title,
                evidence={
                    "loader_time_us": us(loader_ns),
                    "loader_fraction_of_window": frac(loader_ns, w.dur_ns),
                    "gpu_idle_cost_us": us(cost_ns),
                    "calls": int(len(frame)),
                    "iterator": metrics.iterator,
                    "wait_kind": kind if any("MultiProcessing" in n for n in names) else None,
                    # the batch built item by item from tensors in memory (per-item select, then stack)
                    "per_item_indexing": (per_item == "indexing") if main_thread(trace) is not None else None,
                    # ... or indexed, then worked on by torch's operators per item (noise added to each row)
                    "per_item_tensor_ops": (per_item == "tensor_ops") if main_thread(trace) is not None else None,
                    # ... or each item converted from the dataset's memory one at a time (made a tensor, normalised)
                    "per_item_transforms": (per_item == "transforms") if main_thread(trace) is not None and (
                        per_item is not None or transforms_judged(trace) is not None) else None,
                    # ... or each item computed by __getitem__ in the training thread, in work not torch's (Python)
                    "per_item_python": (per_item == "python") if main_thread(trace) is not None and (
                        per_item is not None or python_judged(trace)) else None,
                    # the workers' dataset as the capture read it: its items rows of tensors in memory
                    "dataset_in_memory": in_memory,
                    "advice_if_no_gain": (
                        "Indexing the batch at once would not make the step faster here: replayed without the "
                        "per-item work, the step gains less than 3%; look at the step's other findings."
                        if per_item == "indexing" else
                        "Building the batch at once would not make the step faster here"
                        + ("" if no_core else ", nor would a DataLoader worker on a free core")
                        + ": replayed, the step gains less than 3%; look at the step's other findings."
                        if per_item in ("tensor_ops", "transforms", "python") else
                        "Indexing the batch at once in the training process would not make the step faster here: "
                        "replayed without the waits, the step gains less than 3%; look at the step's other findings."
                        if at_once is not None else
                        "More DataLoader workers would not make the step faster here: replayed "
                        "with more of them, the step gains less than 3%. The loop's wait is what "
                        "taking each batch over costs, or the training itself bounds the step: "
                        "make batches cheaper to hand over, or look at the step's other findings."
                        if any("MultiProcessing" in n for n in names) else
                        "More DataLoader workers would not make the step faster here: replayed "
                        "with more of them, the step gains less than 3%. Taking each batch from a worker "
                        "would cost the loop about what loading it costs now, or the workers would take "
                        "the CPUs the training uses: make each batch cheaper to build (index or transform "
                        "the batch at once, keep decoded data in memory), or look at the step's other findings."
                        if any("SingleProcess" in n for n in names)
                        else None
                    ),
                    "wait_cpu_fraction": round(wait_cpu, 4) if wait_cpu is not None else None,
                    # whose CPU that is: the training thread's own (recorded apart), or the process's (all threads)
                    "wait_cpu_of": (("training thread" if own_cpu else "process") if wait_cpu is not None else None),
                    "worst_steps": [
                        {
                            "step": int(r.step),
                            "loader_us": round(float(r.loader_us), 3),
                            "step_us": round(float(r.step_us), 3),
                        }
                        for r in worst.itertuples()
                    ],
                    "window_us": us(w.dur_ns),
                },
                recommendation=_recommendation(names, pageable, float(first), trace.has_gpu, kind, wait_cpu, cpus,
                                               per_item, own_cpu, at_once,
                                               dataset if isinstance(dataset, str) else None, probed, no_core,
                                               dearer),
                impact_us=float(basis_ns) / 1000.0,
                # on a CPU run the training loader's waits over the run, where the capture timed them: of those a fix
                # removes what it removes of the window's
                run_cost_us=run.recurring_wait_us if over_run and run is not None else None,
                run_cost_scaled=True,
            )
        )
    return AnalysisResult(
        key="loader", metrics=LoaderResult(loader=metrics), tables={"loader_per_step": per_step},
        findings=tuple(findings),
    )
