"""Zero-code capture: one profiler step per optimizer step, stopped cleanly at exit.

Installed by ``kinetoscope capture -- python train.py`` through a
``sitecustomize`` hook. The profiler starts at the first optimizer step, so a
launcher process (``torchrun``) that never steps an optimizer is never
profiled; each worker writes its own rank's trace.
"""

from __future__ import annotations

import atexit
import json
import time
from typing import Any

from kinetoscope.capture._safety import warn_once
from kinetoscope.capture.profiler import Profiler, Schedule

_state: dict[str, Any] = {"profiler": None, "optimizer": None}


def install(config_json: str) -> None:
    config = json.loads(config_json)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    options = config.get("options", {})
    schedule = Schedule(**config.get("schedule", {}))

    def on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            prof = _state["profiler"]
            if prof is None:
                prof = Profiler(config["out_dir"], schedule=schedule, **options)
                prof.start()
                _state["profiler"], _state["optimizer"] = prof, id(optimizer)
                atexit.register(_finish)
                return
            if id(optimizer) == _state["optimizer"]:  # GANs etc.: one optimizer defines the step
                prof.step()
        except Exception as exc:  # noqa: BLE001
            warn_once("capture hook", f"capture hook failed ({type(exc).__name__}: {exc}); training continues")

    register_optimizer_step_post_hook(on_optimizer_step)
    _time_data_loader()


def _time_data_loader() -> None:
    """Count the time each step waits in ``next(DataLoader iterator)``."""
    from torch.utils.data import dataloader

    original = dataloader._BaseDataLoaderIter.__next__

    def timed_next(self: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return original(self)
        finally:
            prof = _state["profiler"]
            if prof is not None:
                prof.add_data_wait(time.perf_counter_ns() - t0)

    dataloader._BaseDataLoaderIter.__next__ = timed_next  # type: ignore[method-assign]


def _finish() -> None:
    prof = _state["profiler"]
    if prof is not None:
        _state["profiler"] = None
        prof.abandon_step()  # the time after the last optimizer step is not a training step
        prof.stop()
