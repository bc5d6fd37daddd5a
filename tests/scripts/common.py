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
