"""A small CPU training run whose steps come in bursts: two DataLoader workers that cannot keep up (each batch
takes --batch-ms in a worker, a sleep with +-noise), so the loop waits for a batch, finds the other worker's
ready, and waits again: a slow step, then a fast one. Random model and data. Usage:
bursty_loader.py STEPS [--batch-ms MS] [--noise N] [--extra-ms MS] [--seed S] [--seconds T] [--ready FILE --go FILE]
--extra-ms: a slowdown planted in every batch's loading (a sleep in the worker). With two workers loading in
parallel and the loop waiting for them, it adds --extra-ms / 2 to the time per step.
--ready, --go, --seconds: runs captured together set up (their DataLoader workers started), wait for each other,
then train for the same stretch of time, so the machine's load falls on all of them alike
(tests/integration/test_diff.py)."""

import argparse
import random
import time

import torch
from common import wait_for_go
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("steps", type=int)
ap.add_argument("--batch-ms", type=float, default=40.0)
ap.add_argument("--noise", type=float, default=0.3)
ap.add_argument("--extra-ms", type=float, default=0.0)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--seconds", type=float, default=None,
                help="stop after this long training (runs started together then\ncover the same stretch of time)")
ap.add_argument("--ready", help="write this file once set up, then wait for --go before training")
ap.add_argument("--go", help="start training once this file exists (runs started together share the machine's load)")
args = ap.parse_args()


class Batches(torch.utils.data.Dataset):
    """One item is one batch (batch_size=None): its loading time is a sleep drawn from the item's index."""

    def __len__(self):
        return args.steps + 8

    def __getitem__(self, i):
        rnd = random.Random(args.seed * 1_000_003 + i)
        time.sleep(args.batch_ms / 1000 * (1 + args.noise * (2 * rnd.random() - 1)) + args.extra_ms / 1000)
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)


torch.set_num_threads(1)  # no OpenMP threads spinning against the workers (and other processes) on few cores
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=2)
batches = iter(loader)  # the workers start (and load their first batches) before the others are ready
wait_for_go(args.ready, args.go)
started = time.monotonic()
for step, (x, y) in enumerate(batches):
    if step == args.steps or (args.seconds and time.monotonic() - started > args.seconds):
        break
    opt.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()
    opt.step()
print("done", flush=True)
