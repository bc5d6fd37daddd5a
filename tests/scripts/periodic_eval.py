"""A small CPU training run with a validation pass every --val-every steps (the slow step of a period), data from
two persistent DataLoader workers, and the loop's own work a sleep of --step-ms (+-noise), which costs no CPU.
Random model and data. Usage:
periodic_eval.py STEPS [--step-ms MS] [--val-ms MS] [--val-every K] [--noise N] [--extra-ms MS] [--seed S]
                 [--seconds T] [--ready FILE --go FILE]
--extra-ms: a slowdown planted in every training step (a sleep in the loop, which the workers keep up with): it
adds --extra-ms to the time per step.
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
ap.add_argument("--step-ms", type=float, default=20.0)
ap.add_argument("--val-ms", type=float, default=60.0)
ap.add_argument("--val-every", type=int, default=10)
ap.add_argument("--noise", type=float, default=0.3)
ap.add_argument("--extra-ms", type=float, default=0.0)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--seconds", type=float, default=None,
                help="stop after this long training (runs started together then\ncover the same stretch of time)")
ap.add_argument("--ready", help="write this file once set up, then wait for --go before training")
ap.add_argument("--go", help="start training once this file exists (runs started together share the machine's load)")
args = ap.parse_args()


class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), torch.randn(1, generator=g)


torch.set_num_threads(1)  # no OpenMP threads spinning against the workers (and other processes) on few cores
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
train = torch.utils.data.DataLoader(Data(8 * (args.steps + 8)), batch_size=8, num_workers=2, persistent_workers=True)
val = torch.utils.data.DataLoader(Data(8 * 3), batch_size=8)
rnd = random.Random(args.seed)
batches = iter(train)  # the workers start (and load their first batches) before the others are ready
wait_for_go(args.ready, args.go)
started = time.monotonic()
for step, (x, y) in enumerate(batches, start=1):
    net.train()
    opt.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()
    time.sleep(args.step_ms / 1000 * (1 + args.noise * (2 * rnd.random() - 1)) + args.extra_ms / 1000)
    opt.step()
    if step % args.val_every == 0:
        net.eval()
        with torch.no_grad():
            for vx, _ in val:
                net(vx)
                time.sleep(args.val_ms / 1000 / len(val))
    if step == args.steps or (args.seconds and time.monotonic() - started > args.seconds):
        break
print("done", flush=True)
