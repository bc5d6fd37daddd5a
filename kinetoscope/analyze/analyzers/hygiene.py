"""Training-loop hygiene: the classic bugs of ``for x, y in loader:`` visible in a trace.

Each check looks at the profiled steps one by one, using the step anatomy's raw events.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.phases import evaluation_steps, phase_events
from kinetoscope.analyze.model.results import Hygiene, HygieneResult
from kinetoscope.analyze.model.timeline import (
    COMPILE_RE,
    any_gpu_busy,
    loader_spans,
    main_thread,
    name_mask,
    step_at,
    top_level,
    window,
)
from kinetoscope.analyze.model.trace import RankTrace, trace_view
from kinetoscope.analyze.model.units import frac, us

_COMPILE_ID_RE = re.compile(r"compile_id=(\d+)/(\d+)")
#: DataLoader iterators draw a shared seed when created or reset: empty().random_().item()
_SEED_GAP_NS = 1_000_000


def _per_step(trace: RankTrace, frame: pd.DataFrame) -> set[int]:
    if frame.empty:
        return set()
    steps = step_at(trace, frame["ts_ns"].to_numpy())
    return set(np.unique(steps[steps >= 0]).tolist())


def _accumulating_steps(trace: RankTrace) -> set[int]:
    """Steps in which every gradient adds into an existing .grad: each of the step's AccumulateGrad nodes holds an
    ``aten::add_``. Under gradient accumulation whose gradients were cleared by setting them to None
    (``model.zero_grad()``, ``optimizer.zero_grad(set_to_none=True)`` outside a recorded span: nothing in the
    trace), the step's first backward pass starts them afresh (no add) and only the later passes add: not this."""
    ev = trace.events
    acc = ev[ev["name"] == "torch::autograd::AccumulateGrad"]
    if acc.empty:
        return set()
    adds = ev[(ev["name"] == "aten::add_")]
    adding = np.zeros(len(acc), dtype=bool)
    positions = np.arange(len(acc))
    for tid, rows in pd.Series(positions).groupby(acc["tid"].astype(str).to_numpy(), observed=True):
        inner = adds[adds["tid"] == tid]
        if inner.empty:
            continue
        idx = rows.to_numpy()
        starts, ends = acc["ts_ns"].to_numpy()[idx], acc["end_ns"].to_numpy()[idx]
        order = np.argsort(starts, kind="stable")
        starts, ends, idx = starts[order], ends[order], idx[order]
        a_ts, a_end = inner["ts_ns"].to_numpy(), inner["end_ns"].to_numpy()
        # the AccumulateGrad node starting last at or before each add (nodes of one thread do not nest)
        at = np.searchsorted(starts, a_ts, side="right") - 1
        ok = at >= 0
        # a zero-length event is inside nothing (an overlap of 0 equals its length of 0 everywhere)
        ok[ok] &= (a_end[ok] <= ends[at[ok]]) & (a_end[ok] > a_ts[ok])
        adding[idx[at[ok]]] = True
    step = step_at(trace, acc["ts_ns"].to_numpy())
    inside = step >= 0
    everywhere = pd.Series(adding[inside]).groupby(step[inside]).all()
    return set(everywhere[everywhere].index.astype(int).tolist())


@trace_view
def _seed_draws(trace: RankTrace) -> pd.DataFrame:
    """``aten::random_`` immediately followed by ``aten::item`` on the training thread: an iterator was created."""
    ev = trace.events
    tid = main_thread(trace)
    if tid is None:
        return ev.iloc[0:0]
    on_main = (ev["tid"] == tid).to_numpy(bool)
    rnd = ev[on_main & name_mask(ev, names=frozenset({"aten::random_"}))]
    items = ev[on_main & name_mask(ev, names=frozenset({"aten::item"}))]
    if rnd.empty or items.empty:
        return rnd.iloc[0:0]
    nxt = np.searchsorted(items["ts_ns"].to_numpy(), rnd["end_ns"].to_numpy())
    ok = nxt < len(items)
    gap = np.where(
        ok, items["ts_ns"].to_numpy()[np.minimum(nxt, len(items) - 1)] - rnd["end_ns"].to_numpy(), _SEED_GAP_NS + 1
    )
    return rnd[gap <= _SEED_GAP_NS]


#: a range covering this share of its step wraps the whole step body (a user's record_function("train_step")): a
#: container, not a library's code
_WRAPS_STEP = 0.9


def _inside_library(trace: RankTrace, raw: dict[str, pd.DataFrame], sync: pd.DataFrame) -> np.ndarray:
    """Syncs made inside another op or a library's annotated range on the training thread (an aten::to's blocking
    copy, an embedding library's all-to-all set-up, ``if tensor:``): not the loop's own ``.item()``, and not removable
    by reading metrics less often."""
    main = raw["main"]
    main = main[(main["kind"].isin(["cpu_op", "annotation"])).to_numpy() & ~main.index.isin(sync.index)
                & ~name_mask(main, _STEP_RE)]
    if main.empty:
        return np.zeros(len(sync), dtype=bool)
    steps = trace.steps
    if len(steps):
        idx = np.clip(np.searchsorted(steps["start_ns"].to_numpy(), main["ts_ns"].to_numpy(), side="right") - 1,
                      0, len(steps) - 1)
        step_dur = steps["dur_ns"].to_numpy()[idx]
        main = main[(main["dur_ns"].to_numpy() < _WRAPS_STEP * step_dur)]
    cover = iv.union(main["ts_ns"].to_numpy(), main["end_ns"].to_numpy())
    dur = sync["dur_ns"].to_numpy()
    return (iv.overlap_each(sync["ts_ns"].to_numpy(), sync["end_ns"].to_numpy(), cover) >= dur) & (dur > 0)


_STEP_RE = re.compile(r"^ProfilerStep#")


def _sync_ops(trace: RankTrace) -> pd.DataFrame:
    """Synchronising calls of the loop itself: not inside optimizer/zero_grad/DataLoader, not a seed draw, not
    made by a library's code inside another op."""
    raw = phase_events(trace)
    sync = top_level(raw["sync"])
    if sync.empty:
        return sync
    excluded = pd.concat([raw["optimizer"], raw["zero_grad"], loader_spans(trace)])
    inside = iv.overlap_each(sync["ts_ns"].to_numpy(), sync["end_ns"].to_numpy(),
                             iv.union(excluded["ts_ns"].to_numpy(), excluded["end_ns"].to_numpy())) > 0
    inside |= _inside_library(trace, raw, sync)
    seeds = _seed_draws(trace)
    after_seed = np.zeros(len(sync), dtype=bool)
    if len(seeds):
        prev = np.searchsorted(seeds["end_ns"].to_numpy(), sync["ts_ns"].to_numpy(), side="right") - 1
        ok = prev >= 0
        after_seed = ok & (sync["ts_ns"].to_numpy() - seeds["end_ns"].to_numpy()[np.maximum(prev, 0)] <= _SEED_GAP_NS)
    return top_level(sync[~inside & ~after_seed])


def _without_backward(trace: RankTrace, raw: dict[str, pd.DataFrame], backward_steps: set[int]) -> set[int]:
    """The steps that hold an optimizer step and no backward pass, where no backward pass ran before that optimizer
    step since its optimizer stepped last either (optimizers told apart by the trace's name,
    ``Optimizer.step#AdamW.step``; a backward inside the optimizer step counts: a closure's). Was: any step with an
    optimizer step and no backward pass, so an iteration whose two optimizers' steps fell into two steps (Muon's ends
    one, AdamW's sits alone in the next, after the same backward) read as a loop that never runs backward. An
    optimizer's first step in the window is judged only where its later ones are without a backward too (its own may
    lie before the window), or, alone, where the window holds no backward at all; one still running as the window
    ends is not judged (a closure's backward inside it, Lightning's, may have run after the profiler stopped).
    Two optimizers of one class (two AdamW) stepping in turn after one backward are told apart only by their step:
    the capture makes one step of such an iteration."""
    opt, bwd = raw["optimizer"], raw["backward"]
    if opt.empty:
        return set()
    b_starts = np.sort(bwd["ts_ns"].to_numpy(np.int64))
    w = window(trace)
    flagged: list[int] = []
    for _, g in opt.sort_values("ts_ns", kind="stable").groupby(opt["name"].astype(str), sort=True):
        ts, end = g["ts_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)
        ts, end = ts[end <= w.end_ns], end[end <= w.end_ns]
        if not len(ts):
            continue
        since = np.concatenate([[w.start_ns], end[:-1]])  # each step's previous one of the same name
        without = np.searchsorted(b_starts, end, side="left") - np.searchsorted(b_starts, since, side="left") == 0
        if without[0] and (not without[1:].all() if len(ts) > 1 else len(b_starts) > 0):
            without[0] = False  # its backward may lie before the window
        flagged += ts[without].tolist()
    if not flagged:
        return set()
    steps = step_at(trace, np.asarray(flagged, dtype=np.int64))
    return set(np.unique(steps[steps >= 0]).tolist()) - backward_steps


def _step_list(steps: set[int]) -> list[int]:
    return sorted(steps)[:20]


@register("hygiene", "Training-loop hygiene")
def analyze_hygiene(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """zero_grad missing or misplaced, optimizer steps vs training steps, no backward, a sync every step,
    DataLoader workers re-spawned, torch.compile recompiling."""
    steps = trace.steps
    if steps.empty:
        return AnalysisResult(key="hygiene", metrics=HygieneResult(hygiene=None))
    raw = phase_events(trace)
    # a step with no op at all is the stub the profiler opens as it stops, and a step the run's end cut
    # short (a crash, a stop) never completed: neither is a training step to judge the loop by
    partial = set(steps.loc[steps["partial"].to_numpy(), "step"].astype(int)) if "partial" in steps else set()
    all_steps = _per_step(trace, raw["main"][raw["main"]["kind"] == "cpu_op"]) - partial
    bwd = _per_step(trace, raw["backward"])
    opt = _per_step(trace, raw["optimizer"])
    zero = _per_step(trace, raw["zero_grad"])
    findings: list[Finding] = []
    findings += _zero_grad(trace, raw, bwd, opt, zero)
    # an evaluation iteration taken for a step (a window inferred from DataLoader waits takes a test loader's
    # batches for steps) is no training step: was "100 optimizer steps for 105 training steps", a warning
    evaluation = set(steps.loc[evaluation_steps(trace), "step"].astype(int)) & all_steps
    findings += _optimizer_mismatch(trace, all_steps - evaluation, bwd, opt, evaluation)
    no_bwd = _without_backward(trace, raw, bwd) & all_steps
    if no_bwd:
        findings.append(Finding(
            id="no_backward", severity="warning", rank=trace.rank,
            title=f"{len(no_bwd)} of {len(all_steps)} steps run an optimizer step without any backward pass before it",
            evidence={"steps": _step_list(no_bwd), "optimizer_steps": len(opt), "backward_steps": len(bwd)},
            recommendation="Call loss.backward() before optimizer.step(); without it the parameters do not change "
                           "(or change only by weight decay/momentum).",
        ))
    findings += _sync_in_loop(trace, all_steps, config)
    findings += _worker_respawn(trace)
    findings += _recompile(trace)
    metrics = Hygiene(
        steps=len(all_steps),
        backward_steps=len(bwd),
        optimizer_steps=len(opt),
        zero_grad_steps=len(zero),
        checks=sorted({"zero_grad_missing", "optimizer_step_mismatch", "no_backward", "sync_in_loop",
                       "worker_respawn", "recompile"}),
    )
    return AnalysisResult(key="hygiene", metrics=HygieneResult(hygiene=metrics), findings=tuple(findings))


def _zero_grad(
    trace: RankTrace, raw: dict[str, pd.DataFrame], bwd: set[int], opt: set[int], zero: set[int]
) -> list[Finding]:
    out = []
    accumulating = _accumulating_steps(trace)
    ordered = sorted(trace.steps["step"].astype(int))
    missing = set()
    for i, s in enumerate(ordered):
        # only after a step we saw update the weights: the first profiled step may end an accumulation
        previous_stepped = i > 0 and ordered[i - 1] in opt
        if s in bwd and s in opt and s not in zero and s in accumulating and previous_stepped:
            missing.add(s)
    if missing:
        out.append(Finding(
            id="zero_grad_missing", severity="warning", rank=trace.rank,
            title=f"Gradients are never cleared: {len(missing)} steps add into the previous step's gradients",
            evidence={"steps": _step_list(missing), "zero_grad_calls": len(raw["zero_grad"]),
                      "signal": "every AccumulateGrad of the step adds into an existing .grad (aten::add_) after an "
                                "optimizer step: no gradient starts afresh"},
            recommendation="Call optimizer.zero_grad(set_to_none=True) once per step, before loss.backward(). If "
                           "accumulating on purpose, step and clear only every N micro-batches.",
        ))
    # zero_grad between the end of backward and the optimizer step wipes the gradients it is about to use
    misplaced = []
    bwd_ev, opt_ev, zero_ev = raw["backward"], raw["optimizer"], raw["zero_grad"]
    for s in sorted(bwd & opt & zero):
        b = bwd_ev[step_at(trace, bwd_ev["ts_ns"].to_numpy()) == s]
        o = opt_ev[step_at(trace, opt_ev["ts_ns"].to_numpy()) == s]
        z = zero_ev[step_at(trace, zero_ev["ts_ns"].to_numpy()) == s]
        if ((z["ts_ns"] >= b["end_ns"].max()) & (z["end_ns"] <= o["ts_ns"].min())).any():
            misplaced.append(s)
    if misplaced:
        out.append(
            Finding(
                id="zero_grad_missing",
                severity="critical",
                rank=trace.rank,
                title=f"zero_grad runs between backward and the optimizer step in {len(misplaced)} steps: "
                "the update uses zeroed gradients",
                evidence={"steps": misplaced[:20]},
                recommendation="Move optimizer.zero_grad() before loss.backward() (or right after optimizer.step()).",
            )
        )
    return out


def _optimizer_mismatch(trace: RankTrace, all_steps: set[int], bwd: set[int], opt: set[int],
                        evaluation: set[int]) -> list[Finding]:
    if not opt or opt == all_steps or len(all_steps) < 2:
        return []
    ordered = sorted(all_steps)
    stepped = [s for s in ordered if s in opt]
    gaps = np.diff([ordered.index(s) for s in stepped]) if len(stepped) > 1 else np.array([])
    regular = len(gaps) > 0 and len(set(gaps.tolist())) == 1 and gaps[0] > 1 and bwd >= all_steps - {ordered[0]}
    every = int(gaps[0]) if regular else None
    return [
        Finding(
            id="optimizer_step_mismatch",
            severity="info" if regular else "warning",
            rank=trace.rank,
            title=(
                f"Gradient accumulation: the optimizer steps every {every} training steps"
                if regular
                else f"{len(opt)} optimizer steps for {len(all_steps)} training steps"
            ),
            evidence={
                "training_steps": len(all_steps),
                "optimizer_steps": len(opt),
                "steps_with_optimizer": stepped[:20],
                "accumulation_every": every,
                "evaluation_steps_left_out": len(evaluation),
            },
            recommendation=(
                "Expected with gradient accumulation; scale the loss by 1/N and clear gradients only after each "
                "optimizer step."
                if regular
                else "Check the loop: an optimizer.step() that is skipped (an early continue, an AMP scaler skipping "
                "inf/NaN steps) or called twice per batch."
            ),
        )
    ]


def _sync_in_loop(trace: RankTrace, all_steps: set[int], config: AnalysisConfig) -> list[Finding]:
    sync = _sync_ops(trace)
    hit = _per_step(trace, sync)
    if len(all_steps) < 2 or len(hit) < 0.8 * len(all_steps):
        return []
    w = window(trace)
    names = sync.groupby("name", observed=True)["dur_ns"].agg(["count", "sum"]).sort_values("sum", ascending=False)
    blocked_ns = int(iv.measure(iv.union(sync["ts_ns"].to_numpy(), sync["end_ns"].to_numpy())))
    cost_ns = None
    if trace.has_gpu:
        from kinetoscope.analyze.model.syncs import sync_cost

        idle = iv.complement(any_gpu_busy(trace), w.start_ns, w.end_ns)
        cost_ns = iv.measure(sync_cost(trace, sync, idle, int(config.sync_refill_max_us * 1000)))
    # what it is worth is the what-if's to say (a sync also keeps the host from running ahead of a busy GPU): the
    # title states what was measured
    if not trace.has_gpu:
        note = "; no device to wait for on this CPU run (on a GPU it would stall the launch queue)"
    else:
        note = (f"; the host waits {blocked_ns / 1e6:,.1f} ms in them over the window, and the GPU idles "
                f"{(cost_ns or 0) / 1e6:,.2f} ms right after them")
    return [
        Finding(
            id="sync_in_loop",
            rank=trace.rank,
            title=f"A host-device sync runs every step ({', '.join(str(n) for n in names.index[:3])}){note}",
            evidence={
                "steps_with_sync": len(hit),
                "steps": len(all_steps),
                "ops": [
                    {"name": str(n), "count": int(r["count"]), "time_us": us(r["sum"])} for n, r in names.iterrows()
                ],
                "host_blocked_us": us(blocked_ns),
                "gpu_idle_caused_us": us(cost_ns),
                "gpu_idle_caused_fraction_of_window": frac(cost_ns, w.dur_ns),
            },
            recommendation="Keep metrics on the device and read them every N steps: accumulate loss.detach() into a "
            "tensor, call .item()/.cpu()/print only when logging; avoid data-dependent Python branching on tensors.",
            impact_us=(cost_ns or 0) / 1000.0,
        )
    ]


def _worker_respawn(trace: RankTrace) -> list[Finding]:
    loop = (trace.meta.capture or {}).get("loop") or {}
    recorded = loop.get("workers")
    if "workers" in (loop.get("recorded") or []) and isinstance(recorded, dict):
        return _worker_respawn_recorded(trace, recorded)
    # not recorded (a trace from elsewhere, a capture before the workers were hooked): inferred
    return _worker_respawn_inferred(trace)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _worker_respawn_recorded(trace: RankTrace, recorded: dict[str, Any]) -> list[Finding]:
    """The capture timed every start and stop of a loader's worker processes over the run: a restart (a loader
    whose workers were started before) is what persistent workers avoid, worth the restarts' time and the stops
    they follow, once each, over the run (was: inferred from a long first wait after a new iterator's seed draw,
    which misses a framework whose epoch end stops 16 workers and starts 16 more before a short first wait)."""
    restarts, restart_ns = _count(recorded.get("restarts")), _count(recorded.get("restart_total_ns"))
    if not restarts or restart_ns is None:
        return []
    marks = trace.marks
    window_restarts: list[dict[str, Any]] = []
    window_ns = 0
    if len(marks):
        names = marks["name"].astype(str).to_numpy()
        rows = marks["row"].to_numpy()
        ts, end = trace.events["ts_ns"].to_numpy()[rows], trace.events["end_ns"].to_numpy()[rows]
        loader = marks["loader"].astype("float64").to_numpy()
        restart = marks["restart"].fillna(False).to_numpy(dtype=bool)
        steps = step_at(trace, ts)
        # the capture says which stops are part of a restart (those it follows, or an old iterator dropped after it)
        window_ns = int((end - ts)[np.isin(names, ["kinetoscope::workers_start", "kinetoscope::workers_stop"])
                                   & restart].sum())
        for i in np.flatnonzero((names == "kinetoscope::workers_start") & restart):
            workers = marks["workers"].iloc[i]
            window_restarts.append({"step": int(steps[i]) if steps[i] >= 0 else None,
                                    "loader": None if np.isnan(loader[i]) else int(loader[i]),
                                    "workers": None if pd.isna(workers) else int(workers),
                                    "start_us": us(int(end[i] - ts[i]))})
    total_us = restart_ns / 1000.0
    return [Finding(
        id="worker_respawn", rank=trace.rank,
        title=(f"DataLoader workers were started again {restarts} time(s) over the run (the capture timed "
               f"{total_us / 1000:,.1f} ms of stopping and restarting them)"),
        evidence={"basis": "capture (every worker start and stop timed)", "run_restarts": restarts,
                  "run_restart_time_us": round(total_us, 3), "run_starts": _count(recorded.get("starts")),
                  "run_stops": _count(recorded.get("stops")),
                  "run_worker_start_stop_time_us": us(_count(recorded.get("total_ns"))),
                  "window_restarts": window_restarts[:20],
                  "not_counted": "a restarted iterator's first batch, which persistent workers wait for too"},
        recommendation="Create the DataLoader once with persistent_workers=True (workers then survive across epochs "
                       "and iterators); do not build a new DataLoader or iter(loader) inside the step loop.",
        impact_us=window_ns / 1000.0,
        one_off_us=total_us,
    )]


def _run_restarts(trace: RankTrace) -> int | None:
    """How many times iterators restarted workers over the run, from a capture made before the workers were timed:
    the worker processes it saw started (``loop.child_processes.dataloader_workers``) over the workers each iterator
    starts, less each multi-process loader's first start. None where the loaders' worker counts differ or are not
    recorded."""
    loop = (trace.meta.capture or {}).get("loop") or {}
    started = _count(((loop.get("child_processes") or {}) if isinstance(loop.get("child_processes"), dict)
                      else {}).get("dataloader_workers"))
    loaders = [x for x in loop.get("loaders") or [] if isinstance(x, dict)]
    multi = [x for x in loaders if (_count(x.get("num_workers")) or 0) > 0]
    counts = {_count(x.get("num_workers")) for x in multi}
    if started is None or not multi or len(counts) != 1 or None in counts:
        return None
    (per,) = counts
    assert per is not None
    if started % per:
        return None
    return max(started // per - len(multi), 0)


def _worker_respawn_inferred(trace: RankTrace) -> list[Finding]:
    loaders = loader_spans(trace)
    multi = loaders[loaders["name"].astype(str).str.contains("MultiProcessing")]
    seeds = _seed_draws(trace)
    if multi.empty or seeds.empty:
        return []
    seeds = seeds[step_at(trace, seeds["ts_ns"].to_numpy()) >= 0]
    typical = float(multi["dur_ns"].median())
    starts = multi["ts_ns"].to_numpy()
    events: list[dict[str, Any]] = []
    seen: set[int] = set()
    for t in seeds["end_ns"].to_numpy():
        i = int(np.searchsorted(starts, t))
        if i >= len(multi) or i in seen:  # one start of a new iterator's workers draws several seeds: one respawn
            continue
        seen.add(i)
        first = multi.iloc[i]
        if first["dur_ns"] >= max(2_000_000, 3 * typical):
            events.append({"step": int(step_at(trace, np.array([t]))[0]), "startup_wait_us": us(first["dur_ns"]),
                           "typical_wait_us": us(typical)})
    if not events:
        return []
    cost = sum(e["startup_wait_us"] - e["typical_wait_us"] for e in events)
    run_restarts = _run_restarts(trace)
    return [Finding(
        id="worker_respawn", rank=trace.rank,
        title=f"DataLoader workers were started {len(events)} time(s) inside the profiled steps",
        evidence={"respawns": events[:20], "startup_cost_us": round(cost, 3), "run_restarts": run_restarts,
                  "run_restarts_from": ("the capture's count of DataLoader worker processes started, over the "
                                        "workers per iterator, less one start per loader")
                  if run_restarts is not None else None},
        run_events=(len(events), run_restarts) if run_restarts else None,
        recommendation="Create the DataLoader once with persistent_workers=True (workers then survive across epochs "
                       "and iterators); do not build a new DataLoader or iter(loader) inside the step loop.",
        impact_us=cost,
    )]


def _compile_worth(compile_ns: int, ids: list[str], recompiles: list[str], compiling_steps: int,
                   run_total_ns: float | None, run_recompile_ns: float | None,
                   run_recompiles: int | None) -> tuple[float | None, str | None]:
    """(one-off total in us, what it is the total of) for a compile finding. Fixing recompiles removes the
    recompilations, not a frame's first compile: the run's recompile time where the capture recorded it; else the
    window's, when the window holds no first compile (scaled by the run's recompiles where the capture counted more).
    A first compile in the window: the run's compile time (was: always that, so one recompile of 11.7 s read as the
    50.5 s of every compile of the run, critical). Recurring compiles with nothing recorded: None (a rate)."""
    if recompiles and run_recompile_ns is not None:
        return run_recompile_ns / 1000.0, "the run's recompilations (capture)"
    if recompiles and len(recompiles) == len(ids):
        if run_recompiles and run_recompiles > len(recompiles):
            return (compile_ns * run_recompiles / len(recompiles) / 1000.0,
                    f"the window's recompilations times the run's {run_recompiles} (capture's count)")
        if run_recompiles is not None or compiling_steps <= 1:
            return compile_ns / 1000.0, "the window's recompilations"
    if run_total_ns:
        return run_total_ns / 1000.0, "the run's compilations (capture)"
    if compiling_steps <= 1:
        return compile_ns / 1000.0, "the window's compilations"
    return None, None


_RECOMPILE_ADVICE = ("Recompiles usually follow changing shapes or Python values: mark varying dims dynamic "
                     "(torch._dynamo.mark_dynamic or dynamic=True), pad to a few fixed shapes, and run with "
                     "TORCH_LOGS=recompiles to see the failing guard.")


def _recompile_outside_window(trace: RankTrace) -> list[Finding]:
    """Recompilations the capture recorded over the run while the window holds none (a warm-up step recompiled for
    the first batch of a new shape): known from the manifest, worth their time over the run (was: nothing, where two
    readers found 27.2 s of recompiling in a 32.3 s run from the capture's own files)."""
    compile_ = ((trace.meta.capture or {}).get("loop") or {}).get("compile") or {}
    recompiles = compile_.get("recompiles")
    total_ns = compile_.get("recompile_total_ns")
    if not isinstance(recompiles, int) or isinstance(recompiles, bool) or recompiles <= 0 \
            or not isinstance(total_ns, (int, float)) or total_ns <= 0:
        return []
    return [Finding(
        id="recompile", rank=trace.rank,
        title=(f"torch.compile recompiled {recompiles} time(s) over the run, outside the profiled window "
               f"({total_ns / 1e9:,.1f} s recompiling, recorded by the capture)"),
        evidence={"compile_ids": [], "steps": [], "compile_time_us": 0.0, "recurs": None,
                  "run_compile_time_us": us(compile_.get("total_ns")) if isinstance(compile_.get("total_ns"),
                                                                                     (int, float)) else None,
                  "run_recompile_time_us": us(total_ns), "run_recompiles": recompiles,
                  "one_off_of": "the run's recompilations (capture)"},
        recommendation=_RECOMPILE_ADVICE,
        impact_us=0.0,
        one_off_us=total_ns / 1000.0,
    )]


def _recompile(trace: RankTrace) -> list[Finding]:
    ev = trace.events
    names = ev["name"].cat.categories
    spans = ev[ev["name"].isin([n for n in names if COMPILE_RE.match(n)])]
    spans = spans[step_at(trace, spans["ts_ns"].to_numpy()) >= 0]
    if spans.empty:
        return _recompile_outside_window(trace)
    ids = sorted({m.group(0).split("=", 1)[1] for n in names for m in [_COMPILE_ID_RE.search(n)] if m})
    recompiles = [i for i in ids if not i.endswith("/0")]
    compile_ns = iv.measure(iv.union(spans["ts_ns"].to_numpy(), spans["end_ns"].to_numpy()))
    w = window(trace)
    compiling_steps = _per_step(trace, spans)
    # compilation in one step of the window is paid once (a shape seen for the first time), not every step: its
    # worth is its total over the run; in several steps it recurs, and the window's rate stands for the run's.
    # Where the capture recorded the run's compile time, that total is what it is worth, whichever it is
    run_total = ((trace.meta.capture or {}).get("loop") or {}).get("compile") or {}
    run_total_ns = run_total.get("total_ns") if isinstance(run_total.get("total_ns"), (int, float)) else None
    run_recompile_ns = (run_total.get("recompile_total_ns")
                        if isinstance(run_total.get("recompile_total_ns"), (int, float)) else None)
    run_recompiles = run_total.get("recompiles") if isinstance(run_total.get("recompiles"), int) else None
    one_off, worth_of = _compile_worth(compile_ns, ids, recompiles, len(compiling_steps), run_total_ns,
                                       run_recompile_ns, run_recompiles)
    return [
        Finding(
            id="recompile",
            rank=trace.rank,
            title=(
                f"torch.compile recompiled {len(recompiles)} time(s) inside the profiled steps "
                f"({compile_ns / max(w.dur_ns, 1):.0%} of the window compiling)"
                if recompiles
                else "torch.compile compiled for the first time inside the profiled steps"
            ),
            evidence={
                "compile_ids": ids,
                "steps": _step_list(compiling_steps),
                "compile_time_us": us(compile_ns),
                "recurs": len(compiling_steps) > 1,
                "run_compile_time_us": us(run_total_ns),
                "run_recompile_time_us": us(run_recompile_ns),
                "run_recompiles": run_recompiles,
                "one_off_of": worth_of,
            },
            recommendation=(
                _RECOMPILE_ADVICE
                if recompiles
                else "Profile after warm-up (a larger skip_first/wait) so compilation is not mistaken for step time."
            ),
            impact_us=compile_ns / 1000.0,
            one_off_us=one_off,
        )
    ]
