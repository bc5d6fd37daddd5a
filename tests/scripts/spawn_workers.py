"""DataLoader workers started with 'spawn' report what capture left in them (nothing, it must be).
Usage: spawn_workers.py"""

import os
import sys

import torch
from common import model, say


class Probe(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i % 16 == 0:
            mods = sorted(m for m in sys.modules if m.startswith("kinetoscope"))
            print(f"worker {os.getpid()} kinetoscope modules {mods} excepthook {sys.excepthook.__module__}", flush=True)
        return torch.randn(32), torch.randn(1)


if __name__ == "__main__":
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Probe(), batch_size=16, num_workers=2, multiprocessing_context="spawn")
    for _epoch in range(3):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    say("done")
