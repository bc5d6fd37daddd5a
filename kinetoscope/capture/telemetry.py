"""GPU telemetry through NVML, sampled on a background thread.

Samples become Chrome counter events (``"ph": "C"``) in the trace, on the
trace's own clock, one counter track per CUDA device index (NVML indices are
mapped through ``CUDA_VISIBLE_DEVICES``). Without NVML or a GPU it logs one
line and does nothing.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kinetoscope.capture._safety import log, warn_once


@dataclass
class Sample:
    unix_ns: int
    cuda_index: int
    values: dict[str, float]


def visible_nvml_handles(nvml: Any) -> list[tuple[int, Any]]:
    """(CUDA index, NVML handle) for each device this process can see."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = nvml.nvmlDeviceGetCount()
    if visible is None or visible.strip() == "":
        return [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)] if visible is None else []
    out = []
    for cuda_index, token in enumerate(t.strip() for t in visible.split(",")):
        if not token:
            continue
        if token.isdigit():
            if int(token) >= count:
                break  # CUDA stops enumerating at the first invalid entry
            out.append((cuda_index, nvml.nvmlDeviceGetHandleByIndex(int(token))))
        else:
            out.append((cuda_index, nvml.nvmlDeviceGetHandleByUUID(token)))
    return out


@dataclass
class TelemetrySampler:
    interval_s: float = 0.5
    samples: list[Sample] = field(default_factory=list)
    max_samples: int = 200_000
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _nvml: Any = None
    _handles: list[tuple[int, Any]] = field(default_factory=list)
    enabled: bool = False

    def start(self) -> bool:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = visible_nvml_handles(pynvml)
        except Exception as exc:  # noqa: BLE001 - no library, no driver, no GPU
            log.info("kinetoscope: GPU telemetry off (%s)", type(exc).__name__)
            return False
        if not self._handles:
            log.info("kinetoscope: GPU telemetry off (no visible GPU)")
            return False
        self.enabled = True
        self._thread = threading.Thread(target=self._run, name="kinetoscope-telemetry", daemon=True)
        self._thread.start()
        return True

    def _read(self, handle: Any) -> dict[str, float]:
        n = self._nvml
        values: dict[str, float] = {}
        for key, read in (
            ("gpu_util_pct", lambda: n.nvmlDeviceGetUtilizationRates(handle).gpu),
            ("mem_util_pct", lambda: n.nvmlDeviceGetUtilizationRates(handle).memory),
            ("mem_used_bytes", lambda: n.nvmlDeviceGetMemoryInfo(handle).used),
            ("sm_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM)),
            ("power_w", lambda: n.nvmlDeviceGetPowerUsage(handle) / 1000.0),
            ("pcie_tx_kb_per_s", lambda: n.nvmlDeviceGetPcieThroughput(handle, n.NVML_PCIE_UTIL_TX_BYTES)),
            ("pcie_rx_kb_per_s", lambda: n.nvmlDeviceGetPcieThroughput(handle, n.NVML_PCIE_UTIL_RX_BYTES)),
        ):
            try:
                values[key] = float(read())
            except Exception:  # noqa: BLE001 - a metric this GPU does not support
                continue
        return values

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                now = time.time_ns()
                for cuda_index, handle in self._handles:
                    if len(self.samples) < self.max_samples:
                        self.samples.append(Sample(now, cuda_index, self._read(handle)))
            except Exception as exc:  # noqa: BLE001
                warn_once("telemetry", f"GPU telemetry stopped ({type(exc).__name__}: {exc})")
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass

    def counter_events(self, base_time_ns: int, start_unix_ns: int, end_unix_ns: int) -> list[dict[str, Any]]:
        """Samples inside [start, end] as counter events on the trace clock (us since base)."""
        return [
            {"ph": "C", "name": f"GPU {s.cuda_index} telemetry", "pid": f"GPU {s.cuda_index}", "tid": 0,
             "ts": (s.unix_ns - base_time_ns) / 1000.0, "args": s.values}
            for s in list(self.samples)
            if start_unix_ns <= s.unix_ns <= end_unix_ns
        ]
