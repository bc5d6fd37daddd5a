"""Shared by the test scripts: a tiny model and dataset, and progress lines the tests wait for."""

import sys
import time

import torch
from torch import nn


class Data(torch.utils.data.Dataset):
    def __init__(self, n=10_000, delay_s=0.0):
        self.n, self.delay_s = n, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), torch.randn(1, generator=g)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))


def say(text):
    print(text, flush=True)
    sys.stdout.flush()


def wait_for_go(ready, go, timeout_s=300):
    """Say this run is set up (``ready``), then wait until ``go`` exists: runs started together then train at
    the same time, under the same load."""
    import os

    if not ready or not go:
        return
    open(ready, "w").close()
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit(f"{go} never appeared")
        time.sleep(0.01)
