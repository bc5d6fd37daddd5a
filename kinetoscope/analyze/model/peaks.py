"""Peak throughput of the accelerators users train on: dense (no sparsity) TFLOP/s by dtype and memory bandwidth.

Data, one row per device, each with its source (the vendor's datasheet or whitepaper). A trace names its devices in
``deviceProperties[].name``; ``peak_for`` matches that name against each row's patterns (the first row that matches
wins, so the more specific rows come first). A name no row matches has no peak: ``None``, never a guess (a CPU, an
unlisted GPU, or a name that does not tell two variants apart, such as a bare "NVIDIA H100").

Matrix peaks are the Tensor Core / Matrix Core rates with FP32 accumulate (what PyTorch's GEMMs use), without
sparsity. ``fp32`` is the best the device does on fp32 inputs without changing precision (on AMD CDNA the FP32 matrix
rate); ``tf32`` is the reduced-precision path for fp32 inputs (TF32 on NVIDIA Ampere and later, XF32 on MI300).
An AMD MI250X is two GCDs and PyTorch sees each GCD as a device: its row holds one GCD's half.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeak:
    """One device's peaks. A dtype the device has no matrix path for is ``None``."""

    device: str
    #: TFLOP/s, dense
    fp32_tflops: float
    tf32_tflops: float | None
    bf16_tflops: float | None
    fp16_tflops: float | None
    fp8_tflops: float | None
    #: GB/s (1e9 bytes per second) of device memory; None where the name does not say which memory
    memory_gbps: float | None
    source: str

    def tflops(self, dtype: str) -> float | None:
        """The peak for work of ``dtype`` (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``)."""
        return {"fp32": self.fp32_tflops, "tf32": self.tf32_tflops, "bf16": self.bf16_tflops,
                "fp16": self.fp16_tflops, "fp8": self.fp8_tflops}.get(dtype)


_NV = "NVIDIA datasheet"
#: (pattern on the device name, case-insensitive; the peak). More specific patterns first.
PEAKS: tuple[tuple[str, DevicePeak], ...] = (
    (r"V100.*(SXM|DGXS)", DevicePeak("V100 SXM2", 15.7, None, None, 125.0, None, 900.0,
                                     f"{_NV}: Tesla V100 (SXM2), 2020")),
    (r"V100.*PCIE", DevicePeak("V100 PCIe", 14.0, None, None, 112.0, None, 900.0, f"{_NV}: Tesla V100 (PCIe), 2020")),
    (r"\bT4\b", DevicePeak("T4", 8.1, None, None, 65.0, None, 320.0, f"{_NV}: Tesla T4, 2019")),
    (r"A10G", DevicePeak("A10G", 31.2, 35.0, 70.0, 70.0, None, 600.0,
                         "AWS EC2 G5 / NVIDIA A10G specifications (Tensor Core rates of the A10G)")),
    (r"\bA10\b", DevicePeak("A10", 31.2, 62.5, 125.0, 125.0, None, 600.0, f"{_NV}: NVIDIA A10, 2021")),
    (r"\bL4\b", DevicePeak("L4", 30.3, 60.0, 121.0, 121.0, 242.5, 300.0, f"{_NV}: NVIDIA L4, 2023")),
    (r"A100.*80\s*GB.*PCIE|A100.*PCIE.*80\s*GB", DevicePeak("A100 80GB PCIe", 19.5, 156.0, 312.0, 312.0, None, 1935.0,
                                                           f"{_NV}: NVIDIA A100 Tensor Core GPU, 2021")),
    (r"A100.*80\s*GB", DevicePeak("A100 80GB SXM", 19.5, 156.0, 312.0, 312.0, None, 2039.0,
                                  f"{_NV}: NVIDIA A100 Tensor Core GPU, 2021")),
    (r"A100.*40\s*GB", DevicePeak("A100 40GB", 19.5, 156.0, 312.0, 312.0, None, 1555.0,
                                  f"{_NV}: NVIDIA A100 Tensor Core GPU, 2021")),
    (r"A100", DevicePeak("A100 (memory not named)", 19.5, 156.0, 312.0, 312.0, None, None,
                         f"{_NV}: NVIDIA A100 Tensor Core GPU, 2021 (the name does not say 40 or 80 GB)")),
    (r"H100.*PCIE", DevicePeak("H100 PCIe", 51.0, 378.0, 756.0, 756.0, 1513.0, 2000.0,
                               f"{_NV}: NVIDIA H100 Tensor Core GPU, 2023 (dense: half the sparse figures)")),
    (r"H100.*(SXM|HBM3)", DevicePeak("H100 SXM", 67.0, 494.7, 989.4, 989.4, 1978.9, 3350.0,
                                     f"{_NV}: NVIDIA H100 Tensor Core GPU, 2023 (dense: half the sparse figures)")),
    (r"H200", DevicePeak("H200", 67.0, 494.7, 989.4, 989.4, 1978.9, 4800.0,
                         f"{_NV}: NVIDIA H200 Tensor Core GPU, 2024 (SXM; dense: half the sparse figures)")),
    (r"GB200", DevicePeak("GB200 (one GPU)", 80.0, 1250.0, 2500.0, 2500.0, 5000.0, 8000.0,
                          f"{_NV}: GB200 NVL72, 2024 (the rack's figures / 72 GPUs; dense: half the sparse figures)")),
    (r"B200", DevicePeak("B200", 75.0, 1100.0, 2250.0, 2250.0, 4500.0, 8000.0,
                         f"{_NV}: HGX B200, 2024 (the board's figures / 8 GPUs; dense: half the sparse figures)")),
    (r"RTX\s*3090", DevicePeak("RTX 3090", 35.6, 35.6, 71.0, 71.0, None, 936.0,
                               "NVIDIA Ampere GA102 GPU architecture whitepaper (FP32 accumulate)")),
    (r"RTX\s*4090", DevicePeak("RTX 4090", 82.6, 82.6, 165.2, 165.2, 330.3, 1008.0,
                               "NVIDIA Ada GPU architecture whitepaper (FP32 accumulate)")),
    (r"MI250X", DevicePeak("MI250X (one GCD)", 47.9, None, 191.5, 191.5, None, 1638.4,
                           "AMD Instinct MI250X datasheet, 2021 (the package's figures / 2 GCDs; FP32 matrix)")),
    (r"MI325X", DevicePeak("MI325X", 163.4, 653.7, 1307.4, 1307.4, 2614.9, 6000.0,
                           "AMD Instinct MI325X datasheet, 2024 (dense; FP32 matrix, XF32 as tf32)")),
    (r"MI300X", DevicePeak("MI300X", 163.4, 653.7, 1307.4, 1307.4, 2614.9, 5300.0,
                           "AMD Instinct MI300X datasheet, 2023 (dense; FP32 matrix, XF32 as tf32)")),
)

_COMPILED = tuple((re.compile(p, re.IGNORECASE), peak) for p, peak in PEAKS)


def peak_for(device_name: str | None) -> DevicePeak | None:
    """The peaks of the device a trace names (``deviceProperties[].name``); None for a name no row matches."""
    if not device_name:
        return None
    for pattern, peak in _COMPILED:
        if pattern.search(device_name):
            return peak
    return None
