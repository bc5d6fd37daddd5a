"""Capture: profile a training loop with torch.profiler. Light by design: torch and NVML only."""

from kinetoscope.capture.profiler import Profiler, Schedule, profile_loop

__all__ = ["Profiler", "Schedule", "profile_loop"]
