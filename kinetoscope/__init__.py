"""Kinetoscope: capture, analyse and present PyTorch training profiles.

Import the part you need: ``kinetoscope.capture`` inside a training job
(torch and NVML only), ``kinetoscope.analyze`` anywhere (no torch).
"""

__version__ = "0.1.0"
