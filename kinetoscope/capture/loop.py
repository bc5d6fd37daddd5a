"""What the training loop does, written down with host clocks while it runs (formats: docs/report.md, "What the
capture writes"): every ``next()`` on a DataLoader iterator, the stretches a root module spends in eval mode,
``backward()`` calls, optimizer steps, torch.compile compilations and checkpoint saves.

The hooks (``hooks.py``) append raw events to each attached ``LoopRecorder``'s ``pending`` list; the recorder
turns them into the run's totals (the manifest's ``loop`` object), per-step lists (steps.json) and marks (spans in
the windows' traces) once per step, at the step boundary (``close_step``): a few us per event, and marks are built
only for the steps a window records.

Rules (issue 28's contract, with two changes, said here and in docs/report.md):
* a loader is "train" when at least half of its batches not taken for evaluation are followed by a
  ``backward()`` before that loader's next batch (change, marks version 3: was half of all its batches, so a loader
  an evaluator iterates too - Ignite's evaluator over the training loader - was "unknown" and its training waits
  were nobody's); "eval" when none are and its batches were taken with grad disabled or a root module in eval mode
  more often than not; "unknown" otherwise (no batches yet included). Change: a batch taken with grad disabled,
  or while a root module is in an eval stretch that has seen no backward, is never "followed" - else the last
  batch of each validation pass, followed by the next training step's backward, would make every validation
  loader "unknown" (and a one-batch validation loader "train").
* each wait is the training loop's or the evaluation's by its batch (marks version 3): a batch taken for evaluation
  (grad disabled, or an eval stretch with no backward yet) is an evaluation wait whatever its loader's role; the
  other waits are the training loop's on a "train" loader, and nobody's on an "unknown" one. A batch taken for
  evaluation that a ``backward()`` follows with no training batch taken in between (the latest such batch, of any
  loader) was trained on after all (``with torch.no_grad(): batch = next(it)``, or ``model.train()`` called after
  ``next()``): it is followed, and neither taken for evaluation nor an evaluation wait.
* a validation stretch runs from a root module's outermost ``.eval()``/``.train(False)`` to its next outermost
  ``.train()`` with no ``backward()`` or optimizer step in between; one still open when the recorder finishes (a
  final evaluation) ends there. Change: a thread's outermost ``torch.no_grad()``/``torch.inference_mode()``
  stretch in which the trained model (a module whose parameters an optimizer that has stepped holds) runs its
  forward twice or more, outside any eval stretch and with no ``backward()`` or optimizer step inside, is a
  validation stretch too (``grad_off: true``): an evaluation loop that never calls ``.eval()`` (was: unmarked, so a
  rank probing its model alone every 5 steps, its partner waiting for it, was lateness that moves). Not marked: one
  forward under no_grad (a pseudo-label, a teacher, a target network); a stretch an eval stretch holds or that
  holds a mode change (``@torch.no_grad()`` around ``model.eval()``: already one); one taken while a training batch
  still waits for its backward (MixMatch's label guesses), or followed by a backward before the next training batch
  or optimizer step (a rollout: its outputs feed the step; so a loop with no DataLoader marks none); none where
  ``torch.compile`` is in use (the hook would be traced into its frames).
* DataLoader workers: each multi-process iterator's start (its construction) and stop (``_shutdown_workers``) is a
  ``kinetoscope::workers_start``/``workers_stop`` span; a start of a loader whose workers were started before is a
  restart (what ``persistent_workers=True`` avoids), and ``restart_total_ns`` is the time of the restarts and of the
  stops they follow. A loader built anew over the dataset of a loader that is gone continues that loader's story
  (a ``DataLoader`` made each epoch restarts its workers too).
* Change: dynamo's lazy backward compilation (it runs inside ``backward()``) is a ``kinetoscope::compile`` span
  too, with ``trigger: "lazy_backward"``, counted in ``total_ns`` but not in ``compiles``; every compile mark says
  its ``trigger``.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

from kinetoscope.capture import hooks
from kinetoscope.capture._safety import warn_once
from kinetoscope.capture.hooks import KINDS, LoopListener

#: version of the marks contract written into the manifest's ``loop`` object
#: 2: a step's validation/compile/checkpoint time is on its wall's clock (1: could exceed it); 3: waits split by
#: batch (taken for evaluation or not), a loader's role counts its batches not taken for evaluation
MARKS_VERSION = 3
PREFIX = "kinetoscope::"
#: steps.json's per-step lists of loop marks (beside step_wall_ns, data_wait_ns, ...)
STEP_LISTS = ("train_data_wait_ns", "eval_data_wait_ns", "validation_ns", "compile_ns", "checkpoint_ns",
              "backward_calls", "optimizer_steps")

#: what ends a step, said in the manifest beside ``step_source`` (``kinetoscope capture`` says more where several
#: optimizers made it choose)
STEP_SOURCE_WHY = {
    "profiler_step": "the script calls Profiler.step()",
    "marker": "the script calls mark_step()",
    "optimizer": "a step ends at each optimizer.step(), any optimizer's",
    "dataloader": "a step ends at each DataLoader iteration",
    "backward": "a step ends at each backward() (no optimizer step and no DataLoader iteration seen)",
}

# --- what the events mean ---------------------------------------------------------------------------------
@dataclass
class _Loader:
    batches: int = 0
    followed: int = 0
    #: next() calls that returned a batch with grad disabled or a root module in eval mode
    evalish: int = 0
    #: batches taken for evaluation: with grad disabled, or in an eval stretch that has seen no backward (never
    #: "followed"; an evaluator iterating the training loader takes these)
    for_evaluation: int = 0

    def role(self) -> str:
        if self.batches == 0:
            return "unknown"
        if self.followed and 2 * self.followed >= self.batches - self.for_evaluation:
            return "train"
        if self.followed == 0 and 2 * self.evalish > self.batches:
            return "eval"
        return "unknown"


@dataclass
class _Pending:
    """A loader's latest batch, not yet followed by a ``backward()``: whether it was taken for evaluation, when (the
    recorder's count of batches), and where its wait went (the recorded step, -1: none; its mark's args)."""

    for_evaluation: bool
    order: int
    step: int = -1
    wait_ns: int = 0
    args: dict[str, Any] | None = None


@dataclass
class _Stretch:
    t0: int
    module: str
    batches: int = 0
    loaders: dict[int, int] = field(default_factory=dict)
    trained: bool = False


@dataclass
class StepLoop:
    """What the loop hooks saw in one step on the training thread: its DataLoader waits (the process's CPU time
    then, and the training thread's own) and the last DataLoader iterator it took a batch from."""

    data_wait_ns: int = 0
    data_wait_cpu_ns: int = 0
    data_wait_thread_cpu_ns: int = 0
    iterator: Any = None


class LoopRecorder:
    """One recording (a ``Profiler``'s, or ``kinetoscope capture``'s for the whole process): the events the hooks
    append to ``pending``, turned into totals, per-step lists and marks at each step boundary."""

    def __init__(self) -> None:
        self.training_thread = threading.get_native_id()
        self.pending: list[tuple[Any, ...]] = []
        self.attached = False
        #: the kinds the hooks could record, as they were installed
        self._recordable: frozenset[str] = frozenset()
        self._loaders: dict[int, _Loader] = {}
        #: per loader, its latest batch while no backward() has followed it
        self._awaiting: dict[int, _Pending] = {}
        self._taken = 0
        self._stretches: dict[int, _Stretch] = {}
        #: the optimizers seen stepping (their numbers in the process, ``hooks.optimizer_id``), in the order first seen
        self._optimizers: list[int] = []
        self._micro = 0
        self.backward_calls = 0
        self.optimizer_steps = 0
        self._validation = {"stretches": 0, "batches": 0}
        self._validation_spans: list[tuple[int, int]] = []
        #: batches taken on the training thread with grad disabled, not yet counted in a grad-off stretch: (time,
        #: loader); and when the latest backward or optimizer step ended (a grad-off stretch holding one trains)
        self._grad_off_batches: list[tuple[int, int]] = []
        self._trained_at = -1
        #: when the latest module mode change was seen; grad-off stretches not yet told apart (``_on_G``)
        self._mode_at = -1
        self._grad_off_pending: list[tuple[_Stretch, int, int, bool]] = []
        self._compile = {"compiles": 0, "recompiles": 0}
        self._compile_spans: list[tuple[int, int]] = []
        #: compilations of a frame compiled before (compile id F/N, N >= 1): what fixing the recompiles removes
        self._recompile_spans: list[tuple[int, int]] = []
        self._checkpoint = {"saves": 0}
        self._checkpoint_spans: list[tuple[int, int]] = []
        #: DataLoader worker processes started and stopped (multi-process iterators); a restart is a start of a
        #: loader whose workers were started before (persistent_workers=False, or iter() called again)
        self._workers = {"starts": 0, "stops": 0, "restarts": 0}
        self._worker_spans: list[tuple[int, int]] = []
        #: what persistent workers would not have paid: each restart's start, and the stop it follows
        self._restart_spans: list[tuple[int, int]] = []
        #: per loader: [starts, stops, stops not yet followed by a restart (span, mark args)]
        self._worker_state: dict[int, list[Any]] = {}
        #: per loader, the stop just recorded: inside the exhausted next() that comes after it
        self._stopping: dict[int, int] = {}
        #: Python child processes started, by kind (hooks.child_started), and the "other" ones' targets
        self._children: dict[str, int] = {"other": 0, "dataloader_worker": 0, "spawned_rank": 0, "helper": 0}
        self._child_targets: list[str] = []
        self._begin_steps(None)
        #: processed marks of the steps a window records: (name, t0, t1, native tid, args)
        self._marks: list[tuple[str, int, int, int, dict[str, Any]]] = []

    # --- hooks -------------------------------------------------------------------------------
    def attach(self, listener: LoopListener | None = None) -> None:
        if not self.attached:
            hooks.attach(self, listener)
            self.attached = True
            self._recordable = hooks.recordable()

    def detach(self, listener: LoopListener | None = None) -> None:
        if self.attached:
            self.attached = False
            hooks.detach(self, listener)

    @property
    def recorded(self) -> list[str]:
        return [k for k in KINDS if k in self._recordable]

    # --- steps ----------------------------------------------------------------------------------------
    def _begin_steps(self, start_unix_ns: int | None) -> None:
        self._step_start = start_unix_ns
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._rows: dict[str, list[int]] = {k: [] for k in (
            "validation_ns", "compile_ns", "checkpoint_ns", "backward_calls", "optimizer_steps")}
        #: per loader, its training-thread waits in each step; and those of its batches taken for evaluation
        self._waits: dict[int, list[int]] = {}
        self._eval_waits: dict[int, list[int]] = {}

    def begin_steps(self, start_unix_ns: int) -> None:
        """The first step starts now (a new ``Profiler``): per-step lists start over, totals go on."""
        self._begin_steps(start_unix_ns)

    def close_step(self, end_unix_ns: int, *, record: bool, keep: bool) -> StepLoop:
        """The step that started at the previous boundary ends now: its events are accounted, a row of the per-step
        lists is added (``record``: it is one of the run's steps), and its marks are kept (``keep``: a window records
        it)."""
        hooks.late_imports()
        events, self.pending = self.pending, []
        start = self._step_start
        if record and start is not None:
            self._starts.append(start)
            self._ends.append(end_unix_ns)
            for values in self._rows.values():
                values.append(0)
            for per_loader in (self._waits, self._eval_waits):
                for values in per_loader.values():
                    values.append(0)
        self._step_start = end_unix_ns
        out = StepLoop()
        for event in events:
            try:
                getattr(self, "_on_" + event[0])(event, out, keep)
            except Exception as exc:  # noqa: BLE001 - one odd event never costs the others
                warn_once("loop event", f"a loop event could not be accounted ({type(exc).__name__}: {exc})")
        return out

    def _step_of(self, t: int) -> int:
        """The recorded step holding time ``t`` (-1: none)."""
        i = bisect.bisect_right(self._starts, t) - 1
        return i if i >= 0 and t <= self._ends[i] else -1

    def _spread(self, row: str, t0: int, t1: int) -> None:
        """Add the overlap of [t0, t1] with each recorded step to that step's ``row``."""
        values = self._rows[row]
        i = max(bisect.bisect_right(self._starts, t0) - 1, 0)
        while i < len(self._starts) and self._starts[i] < t1:
            lo, hi = max(t0, self._starts[i]), min(t1, self._ends[i])
            if hi > lo:
                values[i] += hi - lo
            i += 1

    def _count(self, row: str, t: int) -> None:
        i = self._step_of(t)
        if i >= 0:
            self._rows[row][i] += 1

    def _keep(self, keep: bool, name: str, t0: int, t1: int, tid: int, args: dict[str, Any]) -> None:
        if keep:
            self._marks.append((name, t0, t1, tid, args))

    # --- one event each -----------------------------------------------------------------------------
    def _on_W(self, e: tuple[Any, ...], out: StepLoop, keep: bool) -> None:
        _, t1, wait, cpu, thread_cpu, tid, it, batch, grad, exhausted = e
        lid = hooks.iterator_loader(it)
        loader = self._loaders.setdefault(lid, _Loader())
        for_evaluation = (not grad) or any(not s.trained for s in self._stretches.values())
        if not exhausted:
            loader.batches += 1
            in_eval = bool(self._stretches)
            loader.evalish += (not grad) or in_eval
            loader.for_evaluation += for_evaluation
            self._taken += 1
            if not for_evaluation:  # a training batch: evaluation batches still waiting were not trained on
                self._awaiting = {k: v for k, v in self._awaiting.items() if not v.for_evaluation}
                self._grad_off_settled(True)
            pending = self._awaiting[lid] = _Pending(for_evaluation, self._taken)
        t0 = t1 - wait
        if exhausted:  # the next() that ended a non-persistent iterator stopped its workers: not a wait for data
            stopping = min(self._stopping.pop(lid, 0), wait)
            if stopping:
                cpu = cpu * (wait - stopping) // wait
                thread_cpu = thread_cpu * (wait - stopping) // wait
                wait -= stopping
        if tid == self.training_thread:
            out.data_wait_ns += wait
            out.data_wait_cpu_ns += cpu
            out.data_wait_thread_cpu_ns += thread_cpu
            out.iterator = it
            i = self._step_of(t1)
            if i >= 0:
                for per_loader in (self._waits, self._eval_waits) if for_evaluation else (self._waits,):
                    waits = per_loader.get(lid)
                    if waits is None:
                        waits = per_loader[lid] = [0] * len(self._starts)
                    waits[i] += wait
                if not exhausted:
                    pending.step, pending.wait_ns = i, wait
            if not exhausted:
                for s in self._stretches.values():
                    s.batches += 1
                    s.loaders[lid] = s.loaders.get(lid, 0) + 1
                if not grad and not self._stretches:
                    self._grad_off_batches.append((t1, lid))
        args: dict[str, Any] = {"loader": lid, "role": None, "batch": int(batch), "evaluation": bool(for_evaluation)}
        if exhausted:
            args["exhausted"] = True
        else:
            pending.args = args
        self._keep(keep, "data_wait", t0, t1, tid, args)

    def _on_B(self, e: tuple[Any, ...], out: StepLoop, keep: bool) -> None:
        _, t0, t1, tid = e
        self.backward_calls += 1
        self._micro += 1
        training = [lid for lid, p in self._awaiting.items() if not p.for_evaluation]
        for lid in training:
            self._loaders[lid].followed += 1
        if not training and self._awaiting:
            # no training batch waits for it: the latest batch, though taken with grad disabled or before the module's
            # .train(), is the one trained on (`with torch.no_grad(): next(it)`; `model.train()` after `next()`)
            self._trained_after_all(*max(self._awaiting.items(), key=lambda kv: kv[1].order))
        self._awaiting.clear()
        for s in self._stretches.values():
            s.trained = True
        self._trained(t1, backward=True)
        self._count("backward_calls", t1)
        self._keep(keep, "backward", t0, t1, tid, {"micro_step": self._micro,
                                                    "thread": "main" if tid == self.training_thread else "other"})

    def _trained(self, t1: int, backward: bool) -> None:
        """A backward (``backward``) or optimizer step ended at ``t1``: a grad-off stretch holding it trains, no batch
        taken before it is a later stretch's, and the stretches waiting are the step's own work (a backward came
        first) or evaluations (an optimizer step did)."""
        self._trained_at = max(self._trained_at, t1)
        self._grad_off_batches.clear()
        self._grad_off_settled(not backward)

    def _trained_after_all(self, lid: int, p: _Pending) -> None:
        """A batch taken for evaluation that a backward() followed with no training batch between: a training batch
        after all - followed, no longer for evaluation, its wait the training loop's and its mark saying so."""
        loader = self._loaders[lid]
        loader.followed += 1
        loader.for_evaluation -= 1
        taken = self._eval_waits.get(lid)
        if taken is not None and 0 <= p.step < len(taken):
            taken[p.step] -= p.wait_ns
        if p.args is not None:
            p.args["evaluation"] = False

    def _on_O(self, e: tuple[Any, ...], out: StepLoop, keep: bool) -> None:
        _, t0, t1, tid, opt = e
        for s in self._stretches.values():
            s.trained = True
        self._trained(t1, backward=False)
        if opt not in self._optimizers:
            self._optimizers.append(opt)
        # every optimizer's steps count (a GAN's two, one per layer): was only the first optimizer seen stepping
        self.optimizer_steps += 1
        self._count("optimizer_steps", t1)
        self._keep(keep, "optimizer_step", t0, t1, tid,
                   {"backward_calls": self._micro, "optimizer": self._optimizers.index(opt)})
        self._micro = 0

    def _on_M(self, e: tuple[Any, ...], out: StepLoop, keep: bool) -> None:
        _, t, tid, module, name, mode = e
        self._mode_at = max(self._mode_at, t)
        if not mode:
            self._stretches.setdefault(module, _Stretch(t, name))
            return
        stretch = self._stretches.pop(module, None)
        if stretch is not None and not stretch.trained:
            self._validation_done(stretch, t, tid, keep)

    def _on_G(self, e: tuple[Any, ...], out: StepLoop, keep: bool) -> None:
        """A grad-off stretch in which the trained model ran its forward twice or more: an evaluation - unless an eval
        stretch holds it or began or ended inside it (already one: ``@torch.no_grad()`` around ``model.eval()``), a
        backward or optimizer step ran inside it, or a training batch taken before it still waits for its backward
        (the step's own forward work: pseudo-labels, MixMatch's label guesses). Decided at the next training batch
        or optimizer step: a backward first means its outputs fed the step (a rollout), and it is dropped."""
        _, t0, t1, tid, name, _forwards = e
        batches = [(t, lid) for t, lid in self._grad_off_batches if t0 <= t <= t1]
        self._grad_off_batches = [b for b in self._grad_off_batches if b[0] > t1]
        if (self._stretches or self._trained_at >= t0 or self._mode_at >= t0
                or any(not p.for_evaluation for p in self._awaiting.values())):
            return
        s = _Stretch(t0, name, batches=len(batches))
        for _, lid in batches:
            s.loaders[lid] = s.loaders.get(lid, 0) + 1
        self._grad_off_pending.append((s, t1, tid, keep))

    def _grad_off_settled(self, evaluation: bool) -> None:
        """The grad-off stretches waiting to be told apart: evaluations (``evaluation``), else the step's own work."""
        pending, self._grad_off_pending = self._grad_off_pending, []
        for s, t1, tid, keep in pending if evaluation else ():
            self._validation_done(s, t1, tid, keep, {"grad_off": True})

    def _validation_done(self, s: _Stretch, t1: int, tid: int, keep: bool,
                         more: dict[str, Any] | None = None) -> None:
        self._validation["stretches"] += 1
        self._validation["batches"] += s.batches
        self._validation_spans.append((s.t0, t1))
        self._spread("validation_ns", s.t0, t1)
        loader = max(s.loaders, key=lambda k: (s.loaders[k], -k)) if s.loaders else None
        self._keep(keep, "validation", s.t0, t1, tid,
                   {"module": s.module, "batches": s.batches, "loader": loader, **(more or {})})

    def _on_C(self, e: tuple[Any, ...], out: StepLoop, keep: bool) -> None:
        _, t0, t1, tid, cid, trigger = e
        recompile = _is_recompile(cid)
        if trigger == "dynamo":
            self._compile["compiles"] += 1
            self._compile["recompiles"] += recompile
        self._compile_spans.append((t0, t1))
        if recompile:
            self._recompile_spans.append((t0, t1))
        self._spread("compile_ns", t0, t1)
        self._keep(keep, "compile", t0, t1, tid, {"compile_id": cid, "recompile": recompile, "trigger": trigger})

    def _on_S(self, e: tuple[Any, ...], out: StepLoop, keep: bool) -> None:
        _, t0, t1, tid, call = e
        if tid != self.training_thread:
            return
        self._checkpoint["saves"] += 1
        self._checkpoint_spans.append((t0, t1))
        self._spread("checkpoint_ns", t0, t1)
        self._keep(keep, "checkpoint", t0, t1, tid, {"call": call})

    def _on_L(self, e: tuple[Any, ...], out: StepLoop, keep: bool) -> None:
        _, t0, t1, tid, what, lid, workers, rebuilt = e
        if what == "start":
            self._stopping.pop(lid, None)  # a stop that was no exhausted next()'s (an iterator dropped)
        if rebuilt is not None and lid not in self._worker_state and rebuilt in self._worker_state:
            self._worker_state[lid] = self._worker_state.pop(rebuilt)  # a loader built anew: the same workers' story
        state = self._worker_state.setdefault(lid, [0, 0, []])
        self._worker_spans.append((t0, t1))
        args: dict[str, Any] = {"loader": lid, "workers": workers}
        if what == "start":
            restart = state[0] > 0
            state[0] += 1
            self._workers["starts"] += 1
            if restart:
                self._workers["restarts"] += 1
                self._restart_spans.append((t0, t1))
                for span, stop_args in state[2]:  # the stops it follows are part of it (their marks say so)
                    self._restart_spans.append(span)
                    stop_args["restart"] = True
                state[2] = []
            args["restart"] = restart
        else:
            state[1] += 1
            self._workers["stops"] += 1
            self._stopping[lid] = self._stopping.get(lid, 0) + (t1 - t0)
            # a newer iterator of this loader already runs its own workers (the old one dropped after it started)
            args["restart"] = superseded = state[1] < state[0]
            if superseded:
                self._restart_spans.append((t0, t1))
            else:
                state[2].append(((t0, t1), args))
        self._keep(keep, "workers_" + what, t0, t1, tid, args)

    def _on_P(self, e: tuple[Any, ...], out: StepLoop, keep: bool) -> None:
        _, t, tid, kind, target = e
        self._children[kind] = self._children.get(kind, 0) + 1
        if kind == "other" and target not in self._child_targets:
            self._child_targets.append(target)

    def _child_processes(self) -> dict[str, Any] | None:
        """The manifest's ``child_processes``: the Python child processes this process started (DataLoader workers,
        spawned ranks the capture profiles, multiprocessing's helpers apart), and whether the training ran there:
        true when some were started and this process ran no backward() and no optimizer step (null where either
        was not recorded)."""
        if hooks.CHILD_PROCESS not in self._recordable:
            return None
        started = self._children["other"]
        if "backward" in self._recordable and "optimizer_step" in self._recordable:
            here = self.backward_calls > 0 or self.optimizer_steps > 0
            training_in_children: bool | None = started > 0 and not here
        else:
            training_in_children = None
        return {"started": started, "targets": list(self._child_targets),
                "training_in_children": training_in_children,
                "dataloader_workers": self._children["dataloader_worker"],
                "spawned_ranks": self._children["spawned_rank"]}

    # --- the end, and what is written --------------------------------------------------------------------
    def finish(self, end_unix_ns: int, *, keep: bool) -> None:
        """The recording ends: eval stretches still open (a final evaluation) end here, and grad-off stretches no
        backward followed are evaluations."""
        self._grad_off_settled(True)
        for module in list(self._stretches):
            s = self._stretches.pop(module)
            if not s.trained:
                self._validation_done(s, end_unix_ns, self.training_thread, keep)

    def roles(self) -> dict[int, str]:
        return {lid: loader.role() for lid, loader in self._loaders.items()}

    def take_marks(self, start_unix_ns: int, end_unix_ns: int) -> list[tuple[str, int, int, int, dict[str, Any]]]:
        """The kept marks overlapping [start, end] (a window's span), data waits with their loader's role as now
        known; the kept list starts over."""
        marks, self._marks = self._marks, []
        roles = self.roles()
        out = []
        for name, t0, t1, tid, args in marks:
            if t1 < start_unix_ns or t0 > end_unix_ns:
                continue
            if name == "data_wait":
                args = {**args, "role": roles.get(args["loader"], "unknown")}
            out.append((name, t0, t1, tid, args))
        return out

    def drop_marks(self) -> None:
        self._marks = []

    def _training_loader(self) -> int | None:
        """The loader the training loop takes batches from (role "train", most batches)."""
        roles = self.roles()
        train = [lid for lid, role in roles.items() if role == "train"]
        if not train:
            return None
        return max(train, key=lambda lid: (self._loaders[lid].batches, -lid))

    def training_loader_config(self) -> dict[str, Any] | None:
        """The configuration of the loader the training loop takes batches from (role "train", most batches)."""
        best = self._training_loader()
        if best is None:
            return None
        config = hooks.loader_config(best)
        config.pop("class", None)
        return config

    def training_loader_batch(self) -> Any:
        """The training loader's first batch as shapes and dtypes (``hooks.batch_skeleton``), where it could be
        described."""
        best = self._training_loader()
        return hooks.loader_batch(best) if best is not None else None

    def manifest(self, step_source: str, why: str | None = None) -> dict[str, Any]:
        """The manifest's ``loop`` object: null where a kind was not recorded, never 0. ``why``: what chose the step
        boundary, when the source's own sentence (``STEP_SOURCE_WHY``) does not say it."""
        recorded = self.recorded
        roles = self.roles()
        loaders = []
        for lid in sorted(self._loaders):
            loader = self._loaders[lid]
            loaders.append({"loader": lid, "role": roles[lid], "batches": loader.batches,
                            "batches_followed_by_backward": loader.followed,
                            "batches_for_evaluation": loader.for_evaluation, **hooks.loader_config(lid)})
        return {
            "marks": MARKS_VERSION,
            "recorded": recorded,
            "step_source": step_source,
            "step_source_why": why or STEP_SOURCE_WHY.get(step_source),
            "loaders": loaders if "data_wait" in recorded else None,
            "backward_calls": self.backward_calls if "backward" in recorded else None,
            "optimizer_steps": self.optimizer_steps if "optimizer_step" in recorded else None,
            "optimizers": len(self._optimizers) if "optimizer_step" in recorded else None,
            "validation": (
                {**self._validation, "total_ns": _union_ns(self._validation_spans)}
                if "validation" in recorded
                else None
            ),
            "compile": (
                {**self._compile, "total_ns": _union_ns(self._compile_spans),
                 "recompile_total_ns": _union_ns(self._recompile_spans)} if "compile" in recorded else None
            ),
            "checkpoint": (
                {**self._checkpoint, "total_ns": _union_ns(self._checkpoint_spans)}
                if "checkpoint" in recorded
                else None
            ),
            "workers": (
                {**self._workers, "total_ns": _union_ns(self._worker_spans),
                 "restart_total_ns": _union_ns(self._restart_spans)} if "workers" in recorded else None
            ),
            "child_processes": self._child_processes(),
        }

    def step_lists(self, steps: int, walls_ns: list[int] | None = None) -> dict[str, list[int] | None]:
        """steps.json's per-step lists (``steps`` rows: the Profiler's), null where not recorded.

        ``walls_ns``: the Profiler's step walls (a monotonic clock, read after its own bookkeeping at a boundary). A
        mark's time in a step is measured on the wall clock the hooks read, between this recorder's boundaries; it
        is given on the walls' clock (times wall / span, floored), so that a step wholly inside a validation reads
        its wall, never more (was: 1.00016 of the run's steps, the bookkeeping at each boundary counted twice)."""
        recorded = self.recorded
        n = len(self._starts)
        if n != steps:  # never expected: the lists would not line up with the steps, so they are not written
            warn_once("loop steps", f"loop marks cover {n} steps, the timings {steps}: per-step marks left out")
            recorded = []
        roles = self.roles()

        def waits(role: str) -> list[int]:
            """A train loader's waits less its batches taken for evaluation; an eval loader's waits and every
            loader's batches taken for evaluation."""
            total = [0] * n
            for lid, values in self._waits.items():
                taken = self._eval_waits.get(lid, [0] * n)
                if role == "train":
                    part = [a - b for a, b in zip(values, taken, strict=False)] if roles.get(lid) == "train" else None
                else:
                    part = values if roles.get(lid) == "eval" else taken
                if part is not None:
                    total = [a + b for a, b in zip(total, part, strict=False)]
            return total

        def row(kind: str, name: str) -> list[int] | None:
            return list(self._rows[name]) if kind in recorded else None

        def timed(kind: str, name: str) -> list[int] | None:
            values = row(kind, name)
            if values is None or walls_ns is None or len(walls_ns) != n:
                return values
            spans = [e - s for s, e in zip(self._starts, self._ends, strict=True)]
            return [v * w // span if span > 0 else v for v, w, span in zip(values, walls_ns, spans, strict=True)]

        return {
            "train_data_wait_ns": waits("train") if "data_wait" in recorded else None,
            "eval_data_wait_ns": waits("eval") if "data_wait" in recorded else None,
            "validation_ns": timed("validation", "validation_ns"),
            "compile_ns": timed("compile", "compile_ns"),
            "checkpoint_ns": timed("checkpoint", "checkpoint_ns"),
            "backward_calls": row("backward", "backward_calls"),
            "optimizer_steps": row("optimizer_step", "optimizer_steps"),
        }


def _is_recompile(compile_id: str) -> bool:
    """"0/1": frame 0's second compilation. (Compiled autograd's "!0/1/2" ends the same way.)"""
    tail = compile_id.rsplit("/", 1)
    return len(tail) == 2 and tail[1].isdigit() and int(tail[1]) > 0


def _union_ns(spans: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


# --- into the trace ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WindowMarks:
    """A window's marks on host clocks, and what places them on the trace's clock: each step's host time just
    before and just after ``prof.step()`` started its ``ProfilerStep#N`` span."""

    marks: tuple[tuple[str, int, int, int, dict[str, Any]], ...]
    steps: dict[int, tuple[int, int]]
    pid: int

    def offset_ns(self, step_starts_ns: dict[int, int], base_time_ns: int | None) -> int | None:
        """Trace clock (ns) minus host clock (ns). Each step's span started between its two host times, so the
        offset lies in [trace - after, trace - before] for every step: the largest lower bound is taken (the span
        starts at the very end of ``prof.step()``, so ``after`` is the tight side), kept under the smallest upper
        bound. Without steps in the trace: ``baseTimeNanoseconds`` (the telemetry's placing)."""
        lows, highs = [], []
        for step, trace_ns in step_starts_ns.items():
            host = self.steps.get(step)
            if host is not None:
                before, after = host
                lows.append(trace_ns - after)
                highs.append(trace_ns - before)
        if lows:
            return min(max(lows), min(highs))
        return -base_time_ns if base_time_ns else None

    def events(self, offset_ns: int) -> list[dict[str, Any]]:
        return [{"ph": "X", "cat": "kinetoscope", "name": PREFIX + name, "pid": self.pid, "tid": tid,
                 "ts": round((t0 + offset_ns) / 1000.0, 3), "dur": round(max(t1 - t0, 0) / 1000.0, 3), "args": args}
                for name, t0, t1, tid, args in self.marks]
