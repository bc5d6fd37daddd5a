"""Zero-code capture: one profiler step per training step, whatever shape the loop has.

Installed by ``kinetoscope capture -- python train.py`` through a ``sitecustomize`` hook, once the
script imports torch. What ends a step, by preference: an explicit ``mark_step()`` call, an optimizer
step (``torch.optim``; any optimizer's, so one optimizer per layer trained in turn gives one step per
``step()``; a closure optimizer such as LBFGS steps once however often its closure runs backward), a
DataLoader iteration, a ``backward()`` call (manual SGD loops). The first kind seen that ranks higher takes
over. When two optimizers each step once within one DataLoader iteration on the training thread (a GAN's D then
G; not one optimizer stepping again and again on one batch, then the next: layers trained in turn), a
step is that iteration, as users count them: the steps so far are discarded and the profiler starts over at
the next iteration; the manifest says so (``loop.step_source_why``). Without a DataLoader, several optimizers that
each step once after one ``backward()`` (Muon for the matrices, AdamW for the rest) are one iteration too: a step
ends at the first optimizer step after each ``backward()``. The profiler starts at the first step
boundary, so a launcher process (``torchrun``) that never trains is never profiled.

Capture stands aside, with one line on stderr, when the script runs ``torch.profiler`` itself (two
profilers at once crash torch): at once if one is running, or as soon as the script starts one, before or
after capture's own has started. Only the launched process (or torchrun's and ``torch.multiprocessing.spawn``'s
workers) is profiled: not its subprocesses, multiprocessing children (DataLoader workers) or forks, and a
program it ``exec``s only if it was not profiled itself (its window and manifest are written first).
On SIGTERM (Slurm, Kubernetes) the trace window in progress, the manifest and the step timings are
written before the process ends with the signal as it would have; Ctrl-C (KeyboardInterrupt) runs
the script's own handlers and then the same clean-up at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from kinetoscope.capture._safety import warn_once
from kinetoscope.capture.loop import LoopRecorder
from kinetoscope.capture.profiler import Profiler, Schedule

#: step sources, most preferred first
SOURCES = ("marker", "optimizer", "dataloader", "backward")

_state: dict[str, Any] = {"profiler": None, "optimizers": [], "stepped": None, "per_iteration": None,
                          "stepped_since_backward": None, "per_backward": None, "backward_since_step": False,
                          "stepped_in_step": set(), "closure_backward": False,
                          "source": None, "config": None,
                          "disabled": False, "crashed": None, "pid": None, "loop": None,
                          "profiled": False, "terminating": False, "atexit": False, "watch": None}

#: which processes capture may profile: the one whose parent's pid this names (``kinetoscope capture`` sets
#: it to its own; a process that installs capture sets it to its own for its children, so torchrun's
#: workers qualify; a process that starts profiling sets it to 0, so its subprocesses never do)
PARENT_ENV = "KINETOSCOPE_CAPTURE_PARENT"


def install(config_json: str) -> None:
    import torch

    _state["config"] = json.loads(config_json)
    _state["pid"] = os.getpid()
    os.environ[PARENT_ENV] = str(os.getpid())  # a launcher (torchrun): its workers are the ranks to profile
    # the loop recorder's hooks (DataLoader, backward, optimizer steps, ...) end the steps too: one set of hooks,
    # recording from here on (a compile in the first step, before the profiler starts, is counted)
    loop = LoopRecorder()
    loop.attach(_LISTENER)
    _state["loop"] = loop
    _watch_other_profilers(torch)
    _arm_hang_watch()
    _on_crash_and_signals()
    _hook_exec()
    status(torch=True)


def _arm_hang_watch() -> None:
    """The flight recorder on, and the watchdog started (``hangwatch``): before the script makes its process group."""
    try:
        from kinetoscope.capture.hangwatch import DEFAULT_FR_ENTRIES, HangWatch, arm_flight_recorder

        hang = _state["config"].get("hang") or {}
        if hang.get("off"):
            return
        entries = arm_flight_recorder(int(hang.get("flight_recorder_entries", DEFAULT_FR_ENTRIES)))
        watch = HangWatch(_state["config"]["out_dir"], _progress, timeout_s=hang.get("timeout_s"),
                          fr_entries=entries, terminating=lambda: bool(_state["terminating"]))
        watch.start()
        _state["watch"] = watch
    except Exception as exc:  # noqa: BLE001
        warn_once("hang watchdog", f"hang watchdog not started ({type(exc).__name__}: {exc}); training continues")


def _progress() -> tuple[int | None, int | None, list[int]]:
    """What the watchdog reads of the run: the profiler's step count, its last step's end, its last steps' times."""
    prof = _state["profiler"]
    if prof is None:
        return None, None, []
    return prof.step_num, prof._step_start_ns, prof._step_wall_ns[-100:]


def _stop_hang_watch() -> None:
    watch, _state["watch"] = _state["watch"], None
    if watch is not None:
        watch.stop()


class _StepBoundaries:
    """What ends a step, told by the loop recorder's hooks."""

    def on_data_wait(self, iterator: Any) -> None:
        if threading.current_thread() is threading.main_thread():
            # the optimizers that stepped since this batch: how often; a batch taken without gradients (a validation
            # pass) starts no training iteration (was: a validation loader's last batch, then a loop of two optimizers
            # without a DataLoader, read as a GAN's iteration that never came again: no trace)
            _state["stepped"] = {} if _grad_enabled() else None
            _boundary("dataloader")

    def on_backward(self, in_optimizer_step: int) -> None:
        # a backward() outside an optimizer step (a manual SGD loop) ends a step; inside one (a closure) it does not
        if threading.current_thread() is not threading.main_thread():
            return
        _state["backward_since_step"] = True
        if in_optimizer_step:
            _state["closure_backward"] = True  # the optimizer stepping runs its own backward (LBFGS, Lightning)
            return
        if _state["stepped_since_backward"] is not False:
            _state["stepped_since_backward"] = {}  # the optimizers that stepped since this backward()
        _boundary("backward")

    def on_optimizer_step(self, optimizer: int) -> None:
        # every optimizer's step ends a step (was: only the first optimizer seen, so a GAN's generator steps and all
        # but the first layer's of a per-layer loop fell inside other steps), unless several step per iteration
        oid = optimizer
        if oid not in _state["optimizers"]:
            _state["optimizers"].append(oid)
        if _state["per_iteration"] is not None:
            return
        main = threading.current_thread() is threading.main_thread()
        own_backward, _state["closure_backward"] = _state["closure_backward"] and main, False
        if _state["per_backward"] is not None:
            # several optimizers step after one backward(): the first of them after each backward() ends the step;
            # one stepping again with no backward() seen between (a closure, torch.autograd.grad) ends one too, so a
            # later phase of the loop still has steps
            if main:
                if _state["backward_since_step"] or oid in _state["stepped_in_step"]:
                    _state["backward_since_step"] = False
                    _state["stepped_in_step"] = {oid}
                    _boundary("optimizer")
                else:
                    _state["stepped_in_step"].add(oid)
            return
        stepped = _state["stepped"]
        if stepped is not None and main:
            if oid in stepped:  # one optimizer stepping again in the iteration (layers trained in turn on one batch)
                _state["stepped"] = None  # its steps are the steps: this iteration is no GAN-like one
            else:
                stepped[oid] = 1
                if len(stepped) > 1:  # each of several optimizers once per iteration so far: D then G
                    _per_iteration(len(stepped))
                    return
        since = _state["stepped_since_backward"]
        if own_backward and isinstance(since, dict):
            since.clear()  # its closure's backward() came after the others' steps: it steps after its own
        if stepped is None and isinstance(since, dict) and main:  # no DataLoader iteration: backward() tells them
            if oid in since:  # one optimizer stepping again after one backward(): its steps are the steps
                _state["stepped_since_backward"] = False
            else:
                since[oid] = 1
                if len(since) > 1:  # Muon then AdamW after each backward(): one iteration, two optimizers
                    _per_backward(len(since))
                    return
        if main:
            _state["backward_since_step"] = False
        _boundary("optimizer")


def _per_iteration(optimizers: int) -> None:
    """Several optimizers stepped within one DataLoader iteration: a step is the iteration from here on. The steps
    so far ended at one optimizer's step (part of an iteration): they are no steps of this run; the profiler starts
    over at the next iteration."""
    _start_over(per_iteration=(f"{optimizers} optimizers step in one DataLoader iteration: a step ends at each "
                               "DataLoader iteration (one step = one iteration, every optimizer's step in it)"),
                source="dataloader")


def _per_backward(optimizers: int) -> None:
    """Several optimizers stepped after one backward(), with no DataLoader iteration to mark the iterations: a step
    ends at the first optimizer step after each backward() from here on (the others' steps after the same backward()
    fall in the next step, beside its forward and backward). The steps so far ended at every optimizer's step (part of
    an iteration): they are no steps of this run; the profiler starts over at the next iteration's first optimizer
    step."""
    _start_over(per_backward=(f"{optimizers} optimizers step after one backward(): a step ends at the first "
                              "optimizer step after each backward() (one step = one iteration, every optimizer's "
                              "step in it)"),
                backward_since_step=False, stepped_in_step=set(_state["stepped_since_backward"] or ()))


def _start_over(**state: Any) -> None:
    """What ends a step was learnt late: ``state`` set, and the profiler's steps so far (and their windows) dropped;
    the next boundary starts a new one."""
    try:
        if _state["disabled"] or os.getpid() != _state["pid"]:
            return
        _state.update(state)
        prof, _state["profiler"] = _state["profiler"], None
        if prof is not None:
            prof.discard(drop_written=True)
    except Exception as exc:  # noqa: BLE001
        warn_once("capture hook", f"capture hook failed ({type(exc).__name__}: {exc}); training continues")


def _grad_enabled() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch.is_grad_enabled()) if torch is not None else True
    except Exception:  # noqa: BLE001
        return True


_LISTENER = _StepBoundaries()


def status(**fields: Any) -> None:
    """Tell ``kinetoscope capture`` how this process fares (read when no trace was written, then removed)."""
    write_status(_state["config"]["out_dir"] if _state["config"] else None, fields)


def write_status(out_dir: str | None, fields: dict[str, Any]) -> None:
    if not out_dir:
        return
    path = os.path.join(out_dir, f".kinetoscope-status-{os.getpid()}.json")
    try:
        try:
            with open(path) as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            doc = {"pid": os.getpid()}  # no command line: it may hold secrets, and nothing reads it
        doc.update(fields)
        os.makedirs(out_dir, exist_ok=True)
        with open(path + ".new", "w") as fh:
            json.dump(doc, fh)
        os.replace(path + ".new", path)
    except OSError:
        pass


def mark_step() -> None:
    """End a training step explicitly (for loops no hook recognises). Harmless when not capturing."""
    if _state["config"] is not None:
        _boundary("marker")


def _boundary(kind: str) -> None:
    """A step boundary of one kind: the preferred kind seen so far defines the steps."""
    try:
        if _state["disabled"]:
            return
        if os.getpid() != _state["pid"]:  # a forked child (hogwild, a fork-started worker): not the training run
            _state["disabled"] = True
            return
        current = _state["source"]
        if current is None or SOURCES.index(kind) < SOURCES.index(current):
            _state["source"] = kind
            prof = _state["profiler"]
            if current is not None and prof is not None and (current != "dataloader" or prof.step_num > 0):
                # steps so far were of another kind (DataLoader iterations of an accumulating loop before its
                # first optimizer step or mark_step(), a backward() before the first optimizer step): they are
                # no steps of this run; start over here. (A loop's first next() alone started the step this
                # boundary ends: that one is kept.)
                _state["profiler"] = None
                prof.discard(drop_written=True)
            elif prof is not None:  # the step a loop's first next() started ends here: it is of the new kind
                prof.step_source = kind
        elif kind != current:
            return
        prof = _state["profiler"]
        if prof is None:
            if _profiler_running():
                _stand_aside("the script is already running torch.profiler")
                return
            config = _state["config"]
            os.environ[PARENT_ENV] = "0"  # a training process: its subprocesses (an eval script) are not profiled
            prof = Profiler(config["out_dir"], schedule=Schedule(**config.get("schedule", {})),
                            loop=_state["loop"], step_source=kind, hang_watch=False, **config.get("options", {}))
            prof.step_source_why = (_state["per_iteration"] if kind == "dataloader"
                                    else _state["per_backward"] if kind == "optimizer" else None)
            prof.start()
            _state["profiler"] = prof
            _state["profiled"] = True
            if not _state["atexit"]:
                atexit.register(_finish)
                _state["atexit"] = True
            status(steps=0, source=kind)
            return
        prof.step()
        n = prof.step_num
        if n & (n - 1) == 0:  # 1, 2, 4, 8, ...: what the run got to, should it die without a manifest
            status(steps=n, source=kind)
    except Exception as exc:  # noqa: BLE001
        warn_once("capture hook", f"capture hook failed ({type(exc).__name__}: {exc}); training continues")


def _profiler_running() -> bool:
    try:
        import torch

        return bool(torch.autograd._profiler_enabled())
    except Exception:  # noqa: BLE001
        return False


def _watch_other_profilers(torch: Any) -> None:
    """Stand aside for good as soon as the script starts a profiler of its own, whether ours runs yet or not:
    a scheduled profiler enables itself later, at one of its own steps, and two at once crash torch."""
    from torch.profiler import profiler as kineto_profiler

    def guard(cls: Any) -> None:
        original_start = cls.__dict__["start"]

        def start(self: Any) -> Any:
            if not getattr(self, "_kinetoscope_own", False):
                _stand_aside("the script runs torch.profiler itself")
            return original_start(self)

        cls.start = start

    for cls in (kineto_profiler._KinetoProfile, kineto_profiler.profile):  # profile.start overrides the base's
        if "start" in cls.__dict__:
            guard(cls)

    legacy = torch.autograd.profiler.profile
    original_enter = legacy.__enter__

    def enter(self: Any) -> Any:
        if not getattr(self, "_kinetoscope_own", False):
            _stand_aside("the script runs torch.autograd.profiler itself")
        return original_enter(self)

    legacy.__enter__ = enter


def _hook_exec() -> None:
    """``os.exec*`` replaces the process without running atexit: finish first (the window, the manifest), and
    let the new program be profiled only if this one was not (else it would overwrite this one's files)."""
    for name in ("execv", "execve"):
        original = getattr(os, name, None)
        if original is None:
            continue

        def exec_(*args: Any, _original: Any = original, _name: str = name) -> Any:
            argv = list(args)
            try:
                profiled = _state["profiled"]
                _finish()
                parent = "0" if profiled else str(os.getppid())  # the new image keeps this pid and parent
                os.environ[PARENT_ENV] = parent
                if _name == "execve" and len(argv) > 2 and hasattr(argv[2], "keys"):
                    argv[2] = {**argv[2], PARENT_ENV: parent}
            except Exception:  # noqa: BLE001 - never stop the exec
                pass
            return _original(*argv)

        setattr(os, name, exec_)


def _stand_aside(why: str) -> None:
    if _state["disabled"]:
        return
    _state["disabled"] = True
    prof, _state["profiler"] = _state["profiler"], None
    sys.stderr.write(f"kinetoscope: {why}: capture stands aside (two profilers at once crash torch); "
                     "the script runs as it would without capture\n")
    status(stood_aside=why)
    _stop_hang_watch()  # no profiler, no steps: a watchdog would see a stall
    if prof is not None:
        try:
            prof.discard()
        except Exception:  # noqa: BLE001
            pass
    _release_loop()  # the script runs as it would without capture: nothing patched


def _release_loop() -> None:
    loop, _state["loop"] = _state["loop"], None
    if loop is not None:
        try:
            loop.detach(_LISTENER)
        except Exception:  # noqa: BLE001
            pass


def _on_crash_and_signals() -> None:
    """Note an uncaught exception (the window in progress is then partial); write everything on SIGTERM."""
    previous_hook = sys.excepthook

    def excepthook(exc_type: Any, exc: Any, tb: Any) -> None:
        _state["crashed"] = exc_type.__name__
        watch = _state["watch"]
        if watch is None or exc_type is KeyboardInterrupt:
            previous_hook(exc_type, exc, tb)
        else:
            watch.on_uncaught(exc, lambda: previous_hook(exc_type, exc, tb))

    sys.excepthook = excepthook
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # the script's own handler, if any, stays
        last = [-1.0]

        def on_int(signum: int, frame: Any) -> None:
            # one interrupt may arrive twice: sent to the whole process group (kill -INT -PGID, a scheduler) it
            # reaches this process and the capture CLI, which passes it on; a second KeyboardInterrupt would
            # cut the script's own clean-up short
            now = time.monotonic()
            if now - last[0] < 0.25:
                return
            last[0] = now
            signal.default_int_handler(signum, frame)

        signal.signal(signal.SIGINT, on_int)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # the script's own handler, if any, stays
        def on_term(signum: int, frame: Any) -> None:
            watch = _state["watch"]
            if watch is not None and watch.defer_sigterm():  # it interrupted the rank's own dump: after it
                return
            if _state["terminating"]:  # sent twice (to the process group, and passed on by the CLI): once is enough
                return
            _state["terminating"] = True
            _state["crashed"] = _state["crashed"] or "SIGTERM"  # a crash the SIGTERM came after stays the cause
            if watch is not None:
                watch.on_sigterm()
            _finish()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)  # end as the signal would have: exit status 143

        signal.signal(signal.SIGTERM, on_term)
        if _state["watch"] is not None:
            _state["watch"].own_sigterm(on_term)


def _finish() -> None:
    prof = _state["profiler"]
    if prof is not None:
        _state["profiler"] = None
        prof.abandon_step()  # the time after the last step boundary is not a training step
        prof.stop(ended_by=_state["crashed"])
        status(steps=len(prof._step_wall_ns), finished=True)
    if not _state["terminating"]:
        _stop_hang_watch()
    _release_loop()
