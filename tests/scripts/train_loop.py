"""An ordinary training loop (DataLoader, torch.optim), with the clean-up a real script does on Ctrl-C:
'Exiting from training early', then a final evaluation (like pytorch/examples' word language model).
Usage: train_loop.py STEPS MARKER_FILE [--step-s S] [--noise N] [--no-handler] [--crash-at K] [--inside-at K]"""

import argparse
import random
import time

import torch
from common import Data, model, say

ap = argparse.ArgumentParser()
ap.add_argument("steps", type=int)
ap.add_argument("marker")
ap.add_argument("--step-s", type=float, default=0.0)
ap.add_argument("--noise", type=float, default=0.0)
ap.add_argument("--no-handler", action="store_true")
ap.add_argument("--crash-at", type=int, default=-1)
ap.add_argument("--slow-data-at", type=int, default=-1)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--inside-at", type=int, default=-1, help="write MARKER.inside after this step")
args = ap.parse_args()

net = model()
opt = torch.optim.SGD(net.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Data(), batch_size=16)
rnd = random.Random(args.seed)


def batches():
    """STEPS batches, epoch after epoch (a run of 100000 steps lasts until it is interrupted: one epoch of the
    loader is 625 batches, which a test waiting for a signal must never see end on a busy machine)."""
    step = 0
    while True:
        for batch in loader:
            if step == args.steps:
                return
            yield step, batch
            step += 1


def train():
    for step, (x, y) in batches():
        if step == args.slow_data_at:
            time.sleep(0.5)  # a long wait for data in this step only
        if step == args.crash_at:
            raise RuntimeError(f"crashed in step {step}")
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        if args.step_s:
            time.sleep(args.step_s * (1 + args.noise * (2 * rnd.random() - 1)))
        say(f"step {step}")
        if args.inside_at >= 0 and step == args.inside_at:
            open(args.marker + ".inside", "w").write(f"{step}\n")  # the test's signal: the loop is running


if args.no_handler:
    train()
else:
    try:
        train()
    except KeyboardInterrupt:
        say("Exiting from training early")
    with torch.no_grad():  # the final evaluation a real script still runs
        net(torch.randn(4, 32))
    open(args.marker, "w").write("final evaluation done\n")
say("done")
