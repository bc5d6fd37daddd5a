"""Record real CUDA training traces into sample_traces/gpu/ (run on a machine with an NVIDIA GPU).

Four small ResNet-ish runs, each planting one behaviour, captured with kinetoscope.capture:
  loader_bound  Dataset sleeps 5 ms per sample, num_workers=0            -> loader_stall, gpu_idle
  pageable      38 MB batches from pageable memory, .to(cuda) blocking   -> h2d_pageable, h2d_not_overlapped
  leak          64 MiB of activations kept on the GPU every step         -> memory_growth
  healthy       pinned memory, 4 workers, non_blocking copies prefetched on a side stream -> no findings
Beside each run's folder it writes <run>.expected.json: the JSON report (the golden file
tests/integration/test_golden_gpu.py compares with; outside the folder, which the loader reads whole).
Run: python scripts/record_gpu_traces.py [OUT_DIR]   (needs torch with CUDA; --allow-cpu for a dry run)
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.report.builder import build_report
from kinetoscope.capture import Schedule, profile_loop
from kinetoscope.render.json import report_to_json

SCHEDULE = Schedule(skip_first=3, wait=1, warmup=1, active=5, repeat=1)
STEPS = 14


class Images(Dataset):
    def __init__(self, n: int, shape: tuple[int, ...], delay_s: float = 0.0) -> None:
        self.n, self.shape, self.delay_s = n, shape, delay_s
        self.sample = torch.randn(*shape)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.sample, i % 10


def net(device: torch.device) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    ).to(device)


class Prefetcher:
    """Copy batch i+1 on a side stream while batch i computes."""

    def __init__(self, loader: DataLoader, device: torch.device) -> None:
        self.loader, self.device = loader, device
        self.stream = torch.cuda.Stream(device)

    def __iter__(self):
        it = iter(self.loader)
        nxt = self._load(it)
        while nxt is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            cur, nxt = nxt, self._load(it)
            yield cur

    def _load(self, it):
        try:
            x, y = next(it)
        except StopIteration:
            return None
        with torch.cuda.stream(self.stream):
            return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)


def train(batches, out: Path, device: torch.device, *, leak: bool = False, already_on_device: bool = False) -> None:
    model = net(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    for x, y in profile_loop(batches, out, schedule=SCHEDULE):
        if not already_on_device:
            x, y = x.to(device), y.to(device)  # pageable -> blocking copy
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if leak:
            kept.append(torch.empty(16 * 1024 * 1024, device=device))  # 64 MiB per step, never freed


def main(out_root: Path, allow_cpu: bool) -> None:
    if not torch.cuda.is_available() and not allow_cpu:
        sys.exit("record_gpu_traces: no CUDA device (use --allow-cpu for a dry run)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = (3, 64, 64)
    runs = {
        "loader_bound": lambda out: train(DataLoader(Images(32 * STEPS, small, delay_s=0.005), batch_size=32),
                                          out, device),
        "pageable": lambda out: train(DataLoader(Images(64 * STEPS, (3, 224, 224)), batch_size=64), out, device),
        "leak": lambda out: train(DataLoader(Images(32 * STEPS, small), batch_size=32), out, device, leak=True),
        "healthy": lambda out: train(
            Prefetcher(DataLoader(Images(32 * STEPS, small), batch_size=32, num_workers=4, pin_memory=True,
                                  persistent_workers=True, prefetch_factor=4), device)
            if device.type == "cuda" else DataLoader(Images(32 * STEPS, small), batch_size=32),
            out, device, already_on_device=device.type == "cuda"),
    }
    for name, run in runs.items():
        out = out_root / name
        shutil.rmtree(out, ignore_errors=True)
        run(out)
        report = build_report(load_trace(out))
        (out_root / f"{name}.expected.json").write_text(report_to_json(report, indent=2) + "\n")
        print(f"{name}: findings {[f.id for f in report.findings]}")
        print(json.dumps({k: report.ranks[0].get(k) for k in ("window_us", "steps")}, default=str))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = Path(args[0]) if args else Path(__file__).resolve().parents[1] / "sample_traces" / "gpu"
    main(root, allow_cpu="--allow-cpu" in sys.argv)
