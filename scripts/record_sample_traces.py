"""Record the CPU sample traces in sample_traces/cpu/ with kinetoscope.capture.

Each run is a small real training loop with one planted behaviour:
  loader_bound     Dataset.__getitem__ sleeps 2 ms, num_workers=0        -> loader_stall
  healthy          ready batches, a persistent worker, prefetching       -> no findings
  leak             an activation per step kept in a list                -> memory_growth (CPU)
  no_zero_grad     optimizer.zero_grad() never called                    -> zero_grad_missing
  item_every_step  loss.item() logged every step                         -> sync_in_loop
  respawn_workers  a new 2-worker DataLoader iterator every 3 steps      -> worker_respawn
  recompile        torch.compile(aot_eager) fed a new batch shape often  -> recompile
Run: python scripts/record_sample_traces.py [OUT_DIR [RUN ...]]   (default sample_traces/cpu, every run)
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from kinetoscope.capture import Schedule, profile_loop

SCHEDULE = Schedule(skip_first=2, wait=1, warmup=1, active=5, repeat=1)


class Batches(Dataset):
    """Ready-made batches (``batch_size=None``): loading costs almost nothing."""

    def __init__(self, n: int, batch: int, dim: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(4, batch, dim, generator=g)
        self.y = torch.randn(4, batch, 1, generator=g)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.x[i % 4], self.y[i % 4]


class Synthetic(Dataset):
    def __init__(self, n: int, dim: int, delay_s: float = 0.0) -> None:
        self.n, self.dim, self.delay_s = n, dim, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay_s:
            time.sleep(self.delay_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.dim, generator=g), torch.randn(1, generator=g)


def model(dim: int, hidden: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def train(loader, out: Path, *, leak: bool = False, dim: int = 256, hidden: int = 512,
          zero_grad: bool = True, log_item: bool = False, compiled: bool = False) -> None:
    net = model(dim, hidden)
    forward = torch.compile(net, backend="aot_eager", dynamic=False) if compiled else net
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    kept = []
    for x, y in profile_loop(loader, out, schedule=SCHEDULE, telemetry=False):
        x = x.clone()  # own the batch (a ready-made batch is shared between steps)
        pred = forward(x)
        loss = nn.functional.mse_loss(pred, y)
        if zero_grad:
            opt.zero_grad()
        loss.backward()
        opt.step()
        if log_item:
            print(f"loss {loss.item():.4f}", end="\r")  # a host-device sync on a GPU
        if leak:
            kept.append(net[0](x) * 1.0)  # an activation per step, never freed


def fresh_iterators(dataset: Dataset, every: int, steps: int):
    """A new (non-persistent) multi-worker DataLoader every few steps: workers start over each time."""
    done = 0
    while done < steps:
        for i, batch in enumerate(DataLoader(dataset, batch_size=None, num_workers=2)):
            if i == every or done == steps:
                break
            done += 1
            yield batch


def changing_shapes(steps: int, dim: int):
    g = torch.Generator().manual_seed(0)
    for i in range(steps):
        rows = 64 + 8 * (i // 2)  # a new batch size every other step
        yield torch.randn(rows, dim, generator=g), torch.randn(rows, 1, generator=g)


def main(out_root: Path) -> None:
    torch.set_num_threads(1)
    runs = {
        "loader_bound": lambda out: train(DataLoader(Synthetic(16 * 12, 256, delay_s=0.002), batch_size=16), out),
        "healthy": lambda out: train(
            DataLoader(Batches(12, 256, 256), batch_size=None, num_workers=1, persistent_workers=True,
                       prefetch_factor=4), out, hidden=2048),
        "leak": lambda out: train(DataLoader(Batches(12, 1024, 256), batch_size=None), out, leak=True),
        "no_zero_grad": lambda out: train(DataLoader(Batches(12, 256, 256), batch_size=None), out, zero_grad=False),
        "item_every_step": lambda out: train(DataLoader(Batches(12, 256, 256), batch_size=None), out, log_item=True),
        "respawn_workers": lambda out: train(fresh_iterators(Batches(100, 256, 256), every=3, steps=12), out),
        "recompile": lambda out: train(changing_shapes(12, 256), out, compiled=True),
    }
    only = set(sys.argv[2:])
    for name, run in runs.items():
        if only and name not in only:
            continue
        out = out_root / name
        shutil.rmtree(out, ignore_errors=True)
        run(out)
        print(f"{name}: {sorted(p.name for p in out.iterdir())}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "sample_traces" / "cpu")
