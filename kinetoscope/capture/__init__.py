"""Capture: profile a training loop with torch.profiler. Light by design: torch and NVML only."""

from kinetoscope.capture.auto import mark_step
from kinetoscope.capture.profiler import Profiler, Schedule, profile_loop

__all__ = ["Profiler", "Schedule", "mark_step", "profile_loop"]
