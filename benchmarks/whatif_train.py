"""A small CPU training run whose input pipeline and loop have one knob each, for the what-if pairs.

Run under capture: kinetoscope capture --out DIR -- python benchmarks/whatif_train.py [knobs]
Knobs: --workers N, --prefetch P, --persistent, --epoch-batches B (short epochs), --io-ms (a sleep per batch in
__getitem__: storage or network), --cpu-ms (CPU work per batch in __getitem__: decode/augment), --helper-cpu-ms (CPU
work per batch on another thread of the process, which __getitem__ waits for: a decode or pin-memory thread), --item
(a per-step loss.item()), --slow-op-ms (CPU work in a custom op inside the forward).
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=60)
ap.add_argument("--workers", type=int, default=0)
ap.add_argument("--prefetch", type=int, default=None)
ap.add_argument("--persistent", action="store_true")
ap.add_argument("--epoch-batches", type=int, default=10_000)
ap.add_argument("--io-ms", type=float, default=0.0)
ap.add_argument("--io-every", type=int, default=1, help="only every Nth batch pays --io-ms (bursty loading)")
ap.add_argument("--cpu-ms", type=float, default=0.0)
ap.add_argument("--helper-cpu-ms", type=float, default=0.0)
ap.add_argument("--item", action="store_true")
ap.add_argument("--slow-op-ms", type=float, default=0.0)
ap.add_argument("--width", type=int, default=512)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: less run-to-run noise on 2 cores)")
args = ap.parse_args()
torch.set_num_threads(args.threads)


def spin(ms: float) -> None:
    """``ms`` of this thread's CPU time, as a decode or augmentation costs: under contention it takes longer on
    the clock, never less CPU (spinning for wall time did less work whenever the cores were shared)."""
    end = time.thread_time() + ms / 1000
    x = 0
    while time.thread_time() < end:
        x += 1


class Batches(torch.utils.data.Dataset):
    """Each item is a whole batch (batch_size=None), so its cost is the batch's."""

    def __len__(self) -> int:
        return args.epoch_batches

    def __getitem__(self, i: int):
        if args.io_ms and i % args.io_every == 0:
            time.sleep(args.io_ms / 1000)
        if args.cpu_ms:
            spin(args.cpu_ms)
        if args.helper_cpu_ms:
            helper = threading.Thread(target=spin, args=(args.helper_cpu_ms,))
            helper.start()
            helper.join()
        g = torch.Generator().manual_seed(i)
        return torch.randn(args.batch, args.width, generator=g), torch.randn(args.batch, 1, generator=g)


class SlowOp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        spin(args.slow_op_ms)
        return x * 1.0

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g


torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(args.width, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                          torch.nn.ReLU(), torch.nn.Linear(1024, 1))
opt = torch.optim.SGD(net.parameters(), lr=1e-3)
kw = {}
if args.workers:
    kw = {"prefetch_factor": args.prefetch or 2, "persistent_workers": args.persistent}
loader = torch.utils.data.DataLoader(Batches(), batch_size=None, shuffle=False, num_workers=args.workers, **kw)
done = 0
while done < args.steps:
    for x, y in loader:
        h = SlowOp.apply(x) if args.slow_op_ms else x
        loss = torch.nn.functional.mse_loss(net(h), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.item:
            loss.item()
        done += 1
        if done == args.steps:
            break
