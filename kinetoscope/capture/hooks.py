"""The loop recorder's hooks: one set of patches for the whole process, reference counted and reversible.

``attach()`` (``LoopRecorder.attach``: ``Profiler.start()``, ``kinetoscope capture``) acquires them, ``detach()``
releases them, and the last release puts every patched function back (or, where someone wrapped it after us, leaves
our wrapper in place as a plain pass-through). What is patched: ``_BaseDataLoaderIter.__next__`` (the wait, timed)
and ``DataLoader.__iter__`` (which loader an iterator belongs to), ``_MultiProcessingDataLoaderIter.__init__`` and
``_shutdown_workers`` (starting and stopping a loader's worker processes, timed), ``torch.nn.Module.train`` (the
outermost call only: ``train()`` recurses into the children), ``torch.no_grad`` and ``torch.inference_mode``'s
``__enter__``/``__exit__`` (a thread's outermost grad-off stretch: while it lasts, a global module forward pre-hook
counts the calls of the first module it sees whose parameters an optimizer that has stepped holds, and is removed at
the second; not where ``torch.compile`` is in use, whose frames would trace the hook), ``torch.autograd.backward``
(outermost calls: a reentrant checkpoint's inner backward is part of its outer one), the global optimizer step
hooks, dynamo's compile start/end callbacks (registered once torch._dynamo is imported: ``torch.compile`` is wrapped
to do it, as importing dynamo up front costs ~1.5 s), ``torch.save`` and, once imported,
``torch.distributed.checkpoint.save``/``async_save``, and ``multiprocessing``'s ``Process.start`` (the Python child
processes the script starts).

Per event the thread where it happens pays its clock reads (``time.time_ns``; a DataLoader wait also reads the
``perf_counter`` and process CPU clocks the capture always read) and one append to each recorder's ``pending``
list: what the events mean is worked out by the recorder (``loop.py``), once per step. A forked child (a DataLoader
worker, a hogwild trainer) records nothing of its parent's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from kinetoscope.capture._safety import warn_once

#: the kinds of loop event, in the manifest's order
KINDS = ("data_wait", "validation", "backward", "optimizer_step", "compile", "checkpoint", "workers")
#: the Python child processes the script started (the manifest's ``loop.child_processes``; not a kind of mark)
CHILD_PROCESS = "child_process"


class LoopRecorder(Protocol):
    """What the hooks need of a recorder (``kinetoscope.capture.loop.LoopRecorder``): the list each event is
    appended to, worked out by the recorder once per step."""

    pending: list[Any]


class LoopListener(Protocol):
    """What ``kinetoscope capture`` needs to end its steps (called on the thread where the event happened)."""

    def on_data_wait(self, iterator: Any) -> None: ...

    def on_backward(self, in_optimizer_step: int) -> None: ...

    def on_optimizer_step(self, optimizer: int) -> None:
        """``optimizer``: its number in this process (``_Hooks.optimizer_id``)."""


class _Hooks:
    """The process's patches and who listens to them. One instance (``_HOOKS``); state lives here, not in modules
    the patches touch."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.refs = 0
        self.live = False
        self.recorders: tuple[LoopRecorder, ...] = ()
        self.listeners: tuple[LoopListener, ...] = ()
        self.undo: list[Callable[[], None]] = []
        self.recordable: set[str] = set()
        self.in_optimizer_step = 0
        self.in_backward = 0
        self.local = threading.local()
        self.opt_started: list[int] = []
        self.compile_started: dict[str, int] = {}
        self.dynamo_registered = False
        #: torch.compile was called, or dynamo compiled a frame: the process compiles, and no global module hook is
        #: registered (it would be traced into the compiled frames)
        self.compile_used = False
        self.dcp_patched = False
        self.at_fork = False
        self.grad_enabled: Callable[[], bool] = lambda: True
        #: DataLoader -> its number in this process (from 0), and a loader's sampler -> the same number, for an
        #: iterator made before the patches (it is not tagged)
        self.loader_ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.sampler_ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.loader_config: dict[int, dict[str, Any]] = {}
        #: a single-process loader's batch, as shapes and dtypes (its first batch): what a hand-over probe sends
        self.loader_batch: dict[int, Any] = {}
        #: dataset -> (its last multi-process loader, that loader's number): a loader built anew over it
        self.dataset_loaders: weakref.WeakKeyDictionary[Any, tuple[weakref.ref[Any], int]] = \
            weakref.WeakKeyDictionary()
        self.next_loader = 0
        #: optimizer -> its number in this process (from 0), assigned at its first step: not ``id()``, which a new
        #: optimizer may reuse once an old one is freed (was: SGD and Adam freed, then LBFGS counted as one of them)
        self.optimizer_ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.optimizer_raw_ids: dict[int, int] = {}  # one that cannot be weakly referenced: by id(), as before
        self.next_optimizer = 0
        #: root modules put in eval mode by an outermost .eval()/.train(False), until seen training again: a trainer
        #: may restore training mode by setting ``module.training`` itself (Lightning does), with no call to see
        self.in_eval: dict[int, weakref.ref[Any]] = {}
        #: the ids of the parameters the optimizers seen stepping hold (a grad-off forward of one of their modules is
        #: the trained model's), rebuilt when an optimizer is first seen
        self.optimized: frozenset[int] = frozenset()
        #: module -> whether its first parameter is one of those (the verdict kept while no new optimizer steps)
        self.trained_modules: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()

    def recording(self) -> bool:
        """Whether the patches record now: installed, and this thread not in a ``quiet()`` stretch (a probe's)."""
        return self.live and not getattr(self.local, "quiet", False)

    # --- lifecycle ---------------------------------------------------------------------------
    def acquire(self, recorder: LoopRecorder | None, listener: LoopListener | None) -> None:
        with self.lock:
            if recorder is not None:
                self.recorders += (recorder,)
            if listener is not None:
                self.listeners += (listener,)
            self.refs += 1
            if self.refs == 1:
                self._install()

    def release(self, recorder: LoopRecorder | None, listener: LoopListener | None) -> None:
        with self.lock:
            if recorder is not None and recorder in self.recorders:
                self.recorders = tuple(r for r in self.recorders if r is not recorder)
            if listener is not None and listener in self.listeners:
                self.listeners = tuple(x for x in self.listeners if x is not listener)
            self.refs = max(0, self.refs - 1)
            if self.refs == 0:
                self._uninstall()

    def _install(self) -> None:
        import torch

        if self.undo:  # a forked child's patches, inherited: put back before patching anew (never twice over)
            self._uninstall()
        self.grad_enabled = torch.is_grad_enabled
        self.recordable = set()
        if not self.at_fork:
            os.register_at_fork(after_in_child=_forked_child)
            self.at_fork = True
        for kind, install in (("data_wait", self._patch_data_loader), ("validation", self._patch_train),
                              ("backward", self._patch_backward), ("optimizer_step", self._hook_optimizer),
                              ("compile", self._arm_compile), ("checkpoint", self._patch_save),
                              ("workers", self._patch_workers)):
            try:
                if install(torch):
                    self.recordable.add(kind)
            except Exception as exc:  # noqa: BLE001 - a torch without this hook: that kind is not recorded
                warn_once(f"loop hook {kind}", f"cannot record {kind} marks ({type(exc).__name__}: {exc})")
        if "validation" in self.recordable:
            try:
                self._patch_grad_off(torch)
            except Exception as exc:  # noqa: BLE001 - eval-mode stretches are still recorded
                warn_once("loop hook grad off", "cannot record grad-off evaluations (no_grad, inference_mode) "
                          f"({type(exc).__name__}: {exc})")
        try:
            self._patch_process_start()
            self.recordable.add(CHILD_PROCESS)
        except Exception as exc:  # noqa: BLE001
            warn_once("loop hook child", f"cannot record child processes ({type(exc).__name__}: {exc})")
        self.live = True

    def _uninstall(self) -> None:
        self.live = False
        for undo in reversed(self.undo):
            try:
                undo()
            except Exception:  # noqa: BLE001 - put back what can be put back
                pass
        self.undo.clear()
        self.dynamo_registered = False
        self.dcp_patched = False
        self.in_optimizer_step = self.in_backward = 0
        self.opt_started.clear()
        self.compile_started.clear()

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """Replace ``owner.name`` by ``make(original)``; undone only while ours is still the one in place."""
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        wrapper = make(original)
        setattr(owner, name, wrapper)

        def undo() -> None:
            current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
            if current is wrapper:
                setattr(owner, name, original)

        self.undo.append(undo)

    # --- DataLoader ------------------------------------------------------------------------------
    def _patch_data_loader(self, torch: Any) -> bool:
        from torch.utils.data import dataloader

        hooks = self

        def make_next(original: Any) -> Any:
            @functools.wraps(original)
            def __next__(self: Any) -> Any:
                if not hooks.recording():
                    return original(self)
                p0, c0, q0 = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
                exhausted = False
                try:
                    batch = original(self)
                    if not self.__dict__.get("_kinetoscope_batch_noted", False):
                        hooks.note_batch(self, batch)
                    return batch
                except StopIteration:
                    exhausted = True
                    raise
                finally:
                    # the CPU clocks read inside the wall clock's interval (was: after its end, so a wait spent wholly
                    # on the CPU read 1.0016 of itself on the CPU)
                    q1, c1 = time.thread_time_ns(), time.process_time_ns()
                    p1, t1 = time.perf_counter_ns(), time.time_ns()
                    hooks.data_wait(self, t1, p1 - p0, c1 - c0, q1 - q0, exhausted)

            return __next__

        def make_iter(original: Any) -> Any:
            @functools.wraps(original)
            def __iter__(self: Any) -> Any:
                it = original(self)
                if hooks.recording():
                    try:
                        it._kinetoscope_loader = hooks.loader_id(self, it)
                    except Exception:  # noqa: BLE001 - an iterator of another shape: found by its sampler later
                        pass
                return it

            return __iter__

        self._patch(dataloader._BaseDataLoaderIter, "__next__", make_next)
        self._patch(dataloader.DataLoader, "__iter__", make_iter)
        return True

    def _patch_workers(self, torch: Any) -> bool:
        """A multi-process iterator's construction starts its workers (``persistent_workers`` keeps them for the
        loader's later iterators) and ``_shutdown_workers`` stops them (at exhaustion, or when the iterator is
        dropped): both timed, so a loader whose workers are started again is known, with what it cost."""
        from torch.utils.data import dataloader

        hooks = self
        cls = dataloader._MultiProcessingDataLoaderIter

        def make_init(original: Any) -> Any:
            @functools.wraps(original)
            def __init__(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
                if not hooks.recording():
                    return original(self, loader, *args, **kwargs)
                t0 = time.time_ns()
                try:
                    return original(self, loader, *args, **kwargs)
                finally:
                    hooks.workers_event(self, loader, "start", t0)

            return __init__

        def make_shutdown(original: Any) -> Any:
            @functools.wraps(original)
            def _shutdown_workers(self: Any) -> None:
                # workers never started, or stopped before: nothing to time
                if not hooks.recording() or self.__dict__.get("_shutdown", True):
                    return original(self)
                t0 = time.time_ns()
                try:
                    return original(self)
                finally:
                    hooks.workers_event(self, None, "stop", t0)

            return _shutdown_workers

        self._patch(cls, "__init__", make_init)
        self._patch(cls, "_shutdown_workers", make_shutdown)
        return True

    def workers_event(self, it: Any, loader: Any, what: str, t0: int) -> None:
        try:
            t1 = time.time_ns()
            lid = self.loader_id(loader, it) if loader is not None else self.iterator_loader(it)
            if loader is not None:
                try:
                    it._kinetoscope_loader = lid
                except Exception:  # noqa: BLE001
                    pass
            workers = getattr(it, "_num_workers", None)
            rebuilt = self.rebuilt_from(loader, lid) if loader is not None else None
            event = ("L", t0, t1, threading.get_native_id(), what, lid, workers if isinstance(workers, int) else None,
                     rebuilt)
            for r in self.recorders:
                r.pending.append(event)
        except Exception as exc:  # noqa: BLE001
            warn_once("loop workers", f"DataLoader workers not recorded ({type(exc).__name__}: {exc})")

    def rebuilt_from(self, loader: Any, lid: int) -> int | None:
        """The loader ``loader`` replaces: the last loader over the same dataset object, when that loader is gone (a
        ``DataLoader`` built anew each epoch: its workers start again, as a non-persistent iterator's would)."""
        dataset = getattr(loader, "dataset", None)
        if dataset is None:
            return None
        try:
            before = self.dataset_loaders.get(dataset)
            self.dataset_loaders[dataset] = (weakref.ref(loader), lid)
        except TypeError:  # a dataset that cannot be hashed or weakly referenced: not told
            return None
        if before is None or before[1] == lid or before[0]() is not None:
            return None
        return before[1]

    def data_wait(self, it: Any, t1: int, wait_ns: int, cpu_ns: int, thread_cpu_ns: int, exhausted: bool) -> None:
        try:
            self.training_again(t1 - wait_ns)
            event = ("W", t1, wait_ns, cpu_ns, thread_cpu_ns, threading.get_native_id(), it,
                     getattr(it, "_num_yielded", 0) - (0 if exhausted else 1), self.grad_enabled(), exhausted)
            for r in self.recorders:
                r.pending.append(event)
            for listener in self.listeners:
                listener.on_data_wait(it)
        except Exception as exc:  # noqa: BLE001
            warn_once("loop data wait", f"data wait not recorded ({type(exc).__name__}: {exc}); training continues")

    def note_batch(self, it: Any, batch: Any) -> None:
        """An iterator's first batch, as shapes and dtypes, for its loader (once per iterator): what taking such a
        batch from a worker costs (would cost, where it loads in this process) is measured with it at the capture's
        end."""
        try:
            it._kinetoscope_batch_noted = True
            lid = self.iterator_loader(it)
            if lid not in self.loader_batch:
                self.loader_batch[lid] = batch_skeleton(batch)
        except Exception:  # noqa: BLE001 - an iterator or batch of another shape: no probe for it
            pass

    def loader_id(self, loader: Any, it: Any = None) -> int:
        """The loader's number in this process (from 0), assigned when it is first iterated."""
        n = self.loader_ids.get(loader)
        if n is None:
            n = self.loader_ids[loader] = self._new_loader(_loader_config(loader, type(loader).__name__))
        sampler = getattr(it, "_index_sampler", None) if it is not None else None
        if sampler is not None:
            try:
                self.sampler_ids.setdefault(sampler, n)
            except TypeError:  # a sampler that cannot be weakly referenced
                pass
        return n

    def optimizer_id(self, optimizer: Any) -> int:
        """The optimizer's number in this process (from 0), assigned at its first step."""
        try:
            n = self.optimizer_ids.get(optimizer)
        except TypeError:  # cannot be weakly referenced (or hashed)
            n = self.optimizer_raw_ids.get(id(optimizer))
            if n is None:
                n = self.optimizer_raw_ids[id(optimizer)] = self.next_optimizer
                self.next_optimizer += 1
            return n
        if n is None:
            n = self.optimizer_ids[optimizer] = self.next_optimizer
            self.next_optimizer += 1
        return n

    def iterator_loader(self, it: Any) -> int:
        """The number of the loader ``it`` iterates: its tag, else its loader's sampler, else a new number."""
        n = getattr(it, "_kinetoscope_loader", None)
        if isinstance(n, int):
            return n
        sampler = getattr(it, "_index_sampler", None)
        found = None
        if sampler is not None:
            try:
                found = self.sampler_ids.get(sampler)
            except TypeError:
                found = None
        if found is None:
            found = self._new_loader(_loader_config(it, None))
            if sampler is not None:
                try:
                    self.sampler_ids[sampler] = found
                except TypeError:
                    pass
        try:
            it._kinetoscope_loader = found
        except Exception:  # noqa: BLE001
            pass
        return found

    def _new_loader(self, config: dict[str, Any]) -> int:
        n = self.next_loader
        self.next_loader += 1
        self.loader_config[n] = config
        return n

    # --- eval mode ---------------------------------------------------------------------------------
    def _patch_train(self, torch: Any) -> bool:
        hooks = self

        def make(original: Any) -> Any:
            @functools.wraps(original)
            def train(self: Any, mode: bool = True) -> Any:
                local = hooks.local
                depth: int = getattr(local, "train_depth", 0)
                if not hooks.live or depth:
                    return original(self, mode)  # a child of the call being recorded
                local.train_depth = 1
                try:
                    out = original(self, mode)
                finally:
                    local.train_depth = 0
                hooks.mode_change(self, mode)
                return out

            return train

        self._patch(torch.nn.Module, "train", make)
        return True

    def mode_change(self, module: Any, mode: Any) -> None:
        try:
            event = ("M", time.time_ns(), threading.get_native_id(), id(module), type(module).__name__, bool(mode))
            if mode:
                self.in_eval.pop(id(module), None)
            else:
                self.in_eval[id(module)] = weakref.ref(module)
            for r in self.recorders:
                r.pending.append(event)
        except Exception:  # noqa: BLE001
            pass

    def training_again(self, t: int) -> None:
        """A module in eval mode that is training again with no .train() call seen (its mode set as an attribute)
        ends its eval stretch now, at the latest."""
        if not self.in_eval:
            return
        for mid, ref in list(self.in_eval.items()):
            module = ref()
            if module is None or getattr(module, "training", False):
                del self.in_eval[mid]
                event = ("M", t, threading.get_native_id(), mid, type(module).__name__ if module is not None else "",
                         True)
                for r in self.recorders:
                    r.pending.append(event)

    # --- grad-off stretches -----------------------------------------------------------------------
    def _patch_grad_off(self, torch: Any) -> None:
        from torch.autograd import grad_mode

        for cls in (grad_mode.no_grad, grad_mode.inference_mode):
            self._patch(cls, "__enter__", self._make_enter)
            self._patch(cls, "__exit__", self._make_exit)

    def _make_enter(self, original: Any) -> Any:
        hooks = self

        @functools.wraps(original)
        def __enter__(self: Any) -> Any:
            out = original(self)
            local = hooks.local
            depth: int = getattr(local, "grad_off_depth", 0)
            local.grad_off_depth = depth + 1
            # grad really off (not inference_mode(False)); never where torch.compile is in use: a global module hook
            # would be traced into the compiled frames (graph breaks, recompiles of the user's model)
            if depth == 0 and hooks.live and not hooks.in_optimizer_step and not hooks.in_backward \
                    and not hooks.compile_used and not hooks.grad_enabled() \
                    and not getattr(local, "quiet", False):
                hooks.grad_off_began()
            return out

        return __enter__

    def _make_exit(self, original: Any) -> Any:
        hooks = self

        @functools.wraps(original)
        def __exit__(self: Any, *exc: Any) -> Any:
            local = hooks.local
            depth: int = getattr(local, "grad_off_depth", 0)
            if depth > 0:
                local.grad_off_depth = depth - 1
                if depth == 1:
                    hooks.grad_off_ended()
            return original(self, *exc)

        return __exit__

    def grad_off_began(self) -> None:
        """A thread's outermost grad-off stretch begins: count the forward calls of the first module run in it whose
        parameters an optimizer holds (the trained model's), with a global forward pre-hook removed at the second."""
        try:
            import torch
            from torch.nn.modules.module import register_module_forward_pre_hook

            compiling = torch.compiler.is_compiling
            tid = threading.get_native_id()
            stretch: dict[str, Any] = {"t0": time.time_ns(), "tid": tid, "root": None, "calls": 0, "handle": None}
            optimized, trained = self.optimized, self.trained_modules

            def pre(module: Any, args: Any) -> None:
                if threading.get_native_id() != tid or compiling():
                    return
                if stretch["root"] is None:
                    verdict = trained.get(module)
                    if verdict is None:  # once per module: a frozen teacher's modules are not looked at again
                        first = next(module.parameters(), None)
                        verdict = first is not None and id(first) in optimized
                        with contextlib.suppress(TypeError):
                            trained[module] = verdict
                    if not verdict:
                        return
                    stretch["root"] = module
                elif module is not stretch["root"]:
                    return
                stretch["calls"] += 1
                if stretch["calls"] >= 2 and stretch["handle"] is not None:
                    stretch["handle"].remove()
                    stretch["handle"] = None

            stretch["handle"] = register_module_forward_pre_hook(pre) if optimized else None
            self.local.grad_off = stretch
        except Exception as exc:  # noqa: BLE001
            warn_once("loop grad off", f"a grad-off stretch not recorded ({type(exc).__name__}: {exc})")

    def grad_off_ended(self) -> None:
        """The stretch ends: where the trained model's forward ran twice or more in it, an evaluation (a "G" event)."""
        stretch = getattr(self.local, "grad_off", None)
        if stretch is None:
            return
        self.local.grad_off = None
        try:
            if stretch["handle"] is not None:
                stretch["handle"].remove()
            if stretch["calls"] >= 2 and self.live:
                root = stretch["root"]
                event = ("G", stretch["t0"], time.time_ns(), stretch["tid"], type(root).__name__, stretch["calls"])
                for r in self.recorders:
                    r.pending.append(event)
        except Exception as exc:  # noqa: BLE001
            warn_once("loop grad off", f"a grad-off stretch not recorded ({type(exc).__name__}: {exc})")

    # --- backward and optimizer steps ----------------------------------------------------------
    def _patch_backward(self, torch: Any) -> bool:
        hooks = self

        def make(original: Any) -> Any:
            @functools.wraps(original)
            def backward(*args: Any, **kwargs: Any) -> Any:
                # outermost calls only, process-wide: a reentrant activation checkpoint runs its own backward()
                # inside the outer one, on the engine's thread
                if not hooks.live or hooks.in_backward:
                    return original(*args, **kwargs)
                hooks.in_backward += 1
                t0 = time.time_ns()
                try:
                    return original(*args, **kwargs)
                finally:
                    hooks.in_backward -= 1
                    hooks.backward_done(t0)

            return backward

        self._patch(torch.autograd, "backward", make)
        return True

    def backward_done(self, t0: int) -> None:
        try:
            self.training_again(t0)
            event = ("B", t0, time.time_ns(), threading.get_native_id())
            for r in self.recorders:
                r.pending.append(event)
            for listener in self.listeners:
                listener.on_backward(self.in_optimizer_step)
        except Exception as exc:  # noqa: BLE001
            warn_once("loop backward", f"backward not recorded ({type(exc).__name__}: {exc}); training continues")

    def _hook_optimizer(self, torch: Any) -> bool:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        def before(optimizer: Any, args: Any, kwargs: Any) -> None:
            if self.live:
                self.in_optimizer_step += 1
                self.opt_started.append(time.time_ns())

        def after(optimizer: Any, args: Any, kwargs: Any) -> None:
            if not self.live:
                return
            try:
                t1 = time.time_ns()
                self.in_optimizer_step = max(0, self.in_optimizer_step - 1)
                t0 = self.opt_started.pop() if self.opt_started else t1
                known = self.next_optimizer
                oid = self.optimizer_id(optimizer)
                if self.next_optimizer != known:  # first seen stepping: its parameters are the trained model's
                    self.optimized = self.optimized | {id(p) for g in optimizer.param_groups for p in g["params"]}
                    self.trained_modules = weakref.WeakKeyDictionary()
                event = ("O", t0, t1, threading.get_native_id(), oid)
                for r in self.recorders:
                    r.pending.append(event)
                for listener in self.listeners:
                    listener.on_optimizer_step(oid)
            except Exception as exc:  # noqa: BLE001
                warn_once("loop optimizer", f"optimizer step not recorded ({type(exc).__name__}: {exc})")

        handles = [register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)]

        def remove_hooks() -> None:
            for h in handles:
                h.remove()

        self.undo.append(remove_hooks)
        return True

    # --- child processes ------------------------------------------------------------------------
    def _patch_process_start(self) -> None:
        """``multiprocessing``'s ``Process.start`` (torch.multiprocessing's too: the same class): which Python
        child processes this one started, and for what (a hogwild trainer the capture does not follow)."""
        import multiprocessing.process as mp_process

        hooks = self

        def make(original: Any) -> Any:
            @functools.wraps(original)
            def start(self: Any) -> Any:
                target = getattr(self, "_target", None)  # start() deletes it once the child runs
                out = original(self)
                if hooks.recording():
                    hooks.child_started(self, target)
                return out

            return start

        self._patch(mp_process.BaseProcess, "start", make)

    def child_started(self, process: Any, target: Any) -> None:
        try:
            module = str(getattr(target, "__module__", "") or "") if target is not None else ""
            if target is None:  # a Process subclass with its own run()
                name = type(process).__qualname__
            else:
                name = str(getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
                           or type(target).__name__)
            if module.startswith("torch.utils.data"):
                kind = "dataloader_worker"
            elif module == "torch.multiprocessing.spawn":
                kind = "spawned_rank"  # profiled as a rank of its own (the capture's sitecustomize)
            elif module.startswith("multiprocessing.") and not module.startswith("multiprocessing.pool"):
                kind = "helper"  # a Manager's server, a forkserver
            else:
                kind = "other"
            event = ("P", time.time_ns(), threading.get_native_id(), kind, name)
            for r in self.recorders:
                r.pending.append(event)
        except Exception:  # noqa: BLE001
            pass

    # --- torch.compile --------------------------------------------------------------------------
    def _arm_compile(self, torch: Any) -> bool:
        """Dynamo's callbacks now if dynamo is imported, else on the first ``torch.compile`` call (or at a step
        boundary once something imported it)."""
        if self._register_dynamo():
            return True
        if not callable(getattr(torch, "compile", None)):
            return False
        hooks = self

        def make(original: Any) -> Any:
            @functools.wraps(original)
            def compile(*args: Any, **kwargs: Any) -> Any:
                hooks.compile_used = True
                out = original(*args, **kwargs)  # imports dynamo; compiling happens at the first call of ``out``
                if hooks.live and not hooks.dynamo_registered:
                    hooks._register_dynamo()
                return out

            return compile

        self._patch(torch, "compile", make)
        return True

    def _register_dynamo(self) -> bool:
        module = sys.modules.get("torch._dynamo.callback")
        handler = getattr(module, "callback_handler", None)
        if handler is None or self.dynamo_registered:
            return self.dynamo_registered
        try:
            handler.register_start_callback(self._compile_start)
            handler.register_end_callback(self._compile_end)
        except Exception as exc:  # noqa: BLE001
            warn_once("loop compile", f"cannot record torch.compile ({type(exc).__name__}: {exc})")
            return False
        self.dynamo_registered = True

        def undo() -> None:
            for remove, cb in ((handler.remove_start_callback, self._compile_start),
                               (handler.remove_end_callback, self._compile_end)):
                try:
                    remove(cb)
                except ValueError:
                    pass

        self.undo.append(undo)
        return True

    def _compile_start(self, args: Any) -> None:
        self.compile_used = True
        if self.live:
            self.compile_started[str(getattr(args, "compile_id", ""))] = time.time_ns()

    def _compile_end(self, args: Any) -> None:
        if not self.live:
            return
        try:
            t1 = time.time_ns()
            cid = str(getattr(args, "compile_id", ""))
            t0 = self.compile_started.pop(cid, t1)
            trigger = getattr(getattr(args, "callback_trigger", None), "name", "") or "unknown"
            event = ("C", t0, t1, threading.get_native_id(), cid, trigger.lower())
            for r in self.recorders:
                r.pending.append(event)
        except Exception:  # noqa: BLE001
            pass

    # --- checkpoints ------------------------------------------------------------------------------------
    def _patch_save(self, torch: Any) -> bool:
        self._patch(torch, "save", lambda original: self._timed_save(original, "torch.save"))
        self._patch_dcp()
        return True

    def _patch_dcp(self) -> None:
        dcp = sys.modules.get("torch.distributed.checkpoint")
        if dcp is None or self.dcp_patched:
            return
        self.dcp_patched = True
        for name in ("save", "async_save"):
            if callable(getattr(dcp, name, None)):
                self._patch(dcp, name, functools.partial(self._timed_save, call=f"torch.distributed.checkpoint.{name}"))

    def _timed_save(self, original: Any, call: str) -> Any:
        hooks = self

        @functools.wraps(original)
        def save(*args: Any, **kwargs: Any) -> Any:
            local = hooks.local
            depth: int = getattr(local, "save_depth", 0)
            if not hooks.live or depth:
                return original(*args, **kwargs)  # inside another save (dcp writing through torch.save)
            local.save_depth = 1
            t0 = time.time_ns()
            try:
                return original(*args, **kwargs)
            finally:
                local.save_depth = 0
                event = ("S", t0, time.time_ns(), threading.get_native_id(), call)
                for r in hooks.recorders:
                    r.pending.append(event)

        return save

    def late_imports(self) -> None:
        """At a step boundary: hook what the script imported since (dynamo by another path, dcp)."""
        if not self.live:
            return
        if "compile" in self.recordable and not self.dynamo_registered:
            self._register_dynamo()
        if not self.dcp_patched and "torch.distributed.checkpoint" in sys.modules:
            with self.lock:
                self._patch_dcp()


_HOOKS = _Hooks()


def _forked_child() -> None:
    """A forked child (a DataLoader worker, a hogwild trainer) records nothing of its parent's: the inherited
    patches pass through until the child acquires the hooks itself."""
    hooks = _HOOKS
    hooks.live = False
    hooks.lock = threading.Lock()  # another thread may have held it at the fork
    hooks.refs = 0
    hooks.recorders = ()
    hooks.listeners = ()


def _loader_config(obj: Any, cls: str | None) -> dict[str, Any]:
    """A DataLoader's (or, for an untagged iterator, the iterator's) configuration, as the manifest gives it."""
    try:
        get = lambda *names: next((getattr(obj, n) for n in names if hasattr(obj, n)), None)  # noqa: E731
        sampler = get("batch_sampler", "_index_sampler")
        batch_size = getattr(sampler, "batch_size", None) if sampler is not None else get("batch_size")
        config = {"num_workers": get("num_workers", "_num_workers"),
                  "prefetch_factor": get("prefetch_factor", "_prefetch_factor"),
                  "persistent_workers": get("persistent_workers", "_persistent_workers"),
                  "pin_memory": get("pin_memory", "_pin_memory"),
                  "batch_size": batch_size}
        out = {k: (v if isinstance(v, (int, bool)) or v is None else str(v)) for k, v in config.items()}
    except Exception:  # noqa: BLE001 - a loader of an unexpected shape is described by what is known
        out = {k: None for k in ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "batch_size")}
    out["class"] = cls
    out.update(dataset_facts(getattr(obj, "dataset", None) if hasattr(obj, "dataset")
                             else getattr(obj, "_dataset", None)))
    out["collate"] = _collate_kind(getattr(obj, "collate_fn", None) if hasattr(obj, "collate_fn")
                                   else getattr(obj, "_collate_fn", None))
    return out


def _collate_kind(fn: Any) -> str | None:
    """"default" for PyTorch's own collate (``default_collate``, or ``default_convert`` without automatic batching),
    "custom" for any other function (per-batch work of its own: tokenising, padding, augmenting), None where not
    known. An identity check: nothing of the user's is called."""
    try:
        collate = sys.modules.get("torch.utils.data._utils.collate")
        if fn is None or collate is None:
            return None
        return "default" if fn in (getattr(collate, "default_collate", None),
                                   getattr(collate, "default_convert", None)) else "custom"
    except Exception:  # noqa: BLE001 - an object that cannot be compared
        return None


#: the wrappers a dataset is looked through for where its items come from (``torch.utils.data``'s ``Subset``)
_WRAPPERS = ("Subset",)
#: at most this many of a dataset's attributes are looked at
_DATASET_MAX_ATTRS = 64


def dataset_facts(dataset: Any) -> dict[str, Any]:
    """Where a map-style dataset's items come from, read from the object without calling any of its code but
    ``len()``: ``dataset_class`` (the class's name; a ``Subset`` is looked through, ``dataset_via`` says so; an
    ``IterableDataset`` is named and nothing more), ``dataset_items`` (the loader's items: a Subset's length),
    ``dataset_tensors`` and ``dataset_tensor_bytes`` (the tensors and NumPy arrays the wrapped dataset holds, directly
    or in a list or tuple attribute, with one row per item, each counted once: its samples are in memory, and a batch
    can be taken at once by indexing them), ``dataset_getitem`` ("tensor_rows" for a ``TensorDataset``, whose items
    are those rows and nothing else; "custom" for a class with its own ``__getitem__``, whose per-item work is not
    known). Each null where not known."""
    out: dict[str, Any] = {"dataset_class": None, "dataset_via": None, "dataset_items": None, "dataset_tensors": None,
                           "dataset_tensor_bytes": None, "dataset_getitem": None}
    try:
        if dataset is None:
            return out
        torch = sys.modules.get("torch")
        data = getattr(getattr(torch, "utils", None), "data", None)
        iterable = getattr(data, "IterableDataset", None)
        if iterable is not None and isinstance(dataset, iterable):
            out["dataset_class"] = type(dataset).__name__
            return out  # an iterable-style dataset: no items by index
        # the loader's items: the wrapper's length; where they come from: the wrapped dataset (Subsets of Subsets)
        out["dataset_items"] = len(dataset)
        depth = 0
        while type(dataset).__name__ in _WRAPPERS and hasattr(dataset, "dataset") and depth < 4:
            out["dataset_via"] = type(dataset).__name__
            dataset, depth = dataset.dataset, depth + 1
        cls = type(dataset)
        out["dataset_class"] = cls.__name__
        if not hasattr(cls, "__getitem__"):
            return out
        n = len(dataset)
        attrs = vars(dataset) if hasattr(dataset, "__dict__") else {}
        values: list[Any] = []
        for value in list(attrs.values())[:_DATASET_MAX_ATTRS]:
            values.extend(value[:_DATASET_MAX_ATTRS] if isinstance(value, (list, tuple)) else [value])
        rows = list({id(v): v for v in values if _rows_of(v) == n}.values())  # one tensor held twice counts once
        out["dataset_tensors"] = len(rows)
        out["dataset_tensor_bytes"] = int(sum(int(v.nbytes) for v in rows))
        tensor_dataset = getattr(data, "TensorDataset", None)
        out["dataset_getitem"] = ("tensor_rows" if tensor_dataset is not None and cls is tensor_dataset
                                  else "custom")
    except Exception:  # noqa: BLE001 - a dataset of an unexpected shape: what was read so far
        pass
    return out


def _rows_of(value: Any) -> int | None:
    """The rows of an in-memory CPU tensor or NumPy array (its first dimension), None for anything else."""
    kind = type(value)
    if kind.__name__ == "Tensor" and kind.__module__.startswith("torch"):
        if getattr(value, "is_cpu", False) and value.dim() >= 1:
            return int(value.shape[0])
        return None
    if kind.__name__ == "ndarray" and kind.__module__ == "numpy" and value.ndim >= 1:
        return int(value.shape[0])
    return None


#: a batch skeleton holds at most this many tensors, nested at most this deep (else: none, and no probe)
SKELETON_MAX_TENSORS = 256
SKELETON_MAX_DEPTH = 8


def batch_skeleton(batch: Any) -> Any:
    """A batch's structure with each CPU tensor as ``{"shape": [...], "dtype": "float32"}`` (lists, tuples as
    ``{"tuple": [...]}``, dicts with string keys as ``{"dict": {...}}``, any other leaf as None): JSON data, no
    value of the user's. None for a batch holding a tensor off the CPU, or too many or too deeply nested."""
    count = [0]

    class _Unfit(Exception):
        pass

    def walk(x: Any, depth: int) -> Any:
        if depth > SKELETON_MAX_DEPTH:
            raise _Unfit
        shape, dtype, device = getattr(x, "shape", None), getattr(x, "dtype", None), getattr(x, "device", None)
        if shape is not None and dtype is not None and device is not None and hasattr(x, "element_size"):
            if getattr(device, "type", None) != "cpu":
                raise _Unfit
            count[0] += 1
            if count[0] > SKELETON_MAX_TENSORS:
                raise _Unfit
            return {"shape": [int(n) for n in shape], "dtype": str(dtype).removeprefix("torch.")}
        if isinstance(x, list):
            return [walk(v, depth + 1) for v in x]
        if isinstance(x, tuple):
            return {"tuple": [walk(v, depth + 1) for v in x]}
        if isinstance(x, dict) and all(isinstance(k, str) for k in x):
            return {"dict": {k: walk(v, depth + 1) for k, v in x.items()}}
        return None

    try:
        return walk(batch, 0)
    except _Unfit:
        return None


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Nothing this thread does with DataLoaders or processes is recorded meanwhile (the capture's own probes)."""
    before = getattr(_HOOKS.local, "quiet", False)
    _HOOKS.local.quiet = True
    try:
        yield
    finally:
        _HOOKS.local.quiet = before


def loader_batch(loader: int) -> Any:
    """Loader ``loader``'s first batch as shapes and dtypes (``batch_skeleton``), where noted."""
    return _HOOKS.loader_batch.get(loader)


def attach(recorder: LoopRecorder | None = None, listener: LoopListener | None = None) -> None:
    """Acquire the process's loop hooks for a recorder and/or a listener (installed on the first acquire)."""
    _HOOKS.acquire(recorder, listener)


def detach(recorder: LoopRecorder | None = None, listener: LoopListener | None = None) -> None:
    """Release what ``attach`` acquired; the last release puts every patched function back."""
    _HOOKS.release(recorder, listener)


def recordable() -> frozenset[str]:
    """The kinds of event the installed hooks record."""
    return frozenset(_HOOKS.recordable)


def iterator_loader(it: Any) -> int:
    """The number of the DataLoader a DataLoader iterator belongs to (from 0, in the order first seen)."""
    return _HOOKS.iterator_loader(it)


def loader_config(loader: int) -> dict[str, Any]:
    """Loader ``loader``'s configuration as the manifest gives it (num_workers, ..., class)."""
    return dict(_HOOKS.loader_config.get(loader, {}))


def late_imports() -> None:
    """At a step boundary: hook what the script imported since (dynamo by another path, dcp)."""
    _HOOKS.late_imports()


def is_data_loader_iterator(it: Any) -> bool:
    """Whether ``next(it)`` is timed by the hooks (a DataLoader iterator while they are installed)."""
    if not _HOOKS.live or "data_wait" not in _HOOKS.recordable:
        return False
    module = sys.modules.get("torch.utils.data.dataloader")
    base = getattr(module, "_BaseDataLoaderIter", None)
    return base is not None and isinstance(it, base)
