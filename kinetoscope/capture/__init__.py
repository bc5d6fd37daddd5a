"""Capture: profile a training loop with torch.profiler. Light by design: torch and NVML only.

The names below are imported on first use, so ``kinetoscope analyze`` (whose command line lists
``capture``) does not pay for the capture's imports."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kinetoscope.capture.auto import mark_step
    from kinetoscope.capture.profiler import Profiler, Schedule, profile_loop

__all__ = ["Profiler", "Schedule", "mark_step", "profile_loop"]
_HOME = {"mark_step": "auto", "Profiler": "profiler", "Schedule": "profiler", "profile_loop": "profiler"}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(f"kinetoscope.capture.{home}"), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")  # a submodule: kinetoscope.capture.profiler
    else:
        raise AttributeError(f"module 'kinetoscope.capture' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
