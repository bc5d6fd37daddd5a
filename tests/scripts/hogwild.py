"""Hogwild: the launched process only starts trainers (torch.multiprocessing, fork or spawn), which train a
shared model. Usage: hogwild.py fork|spawn"""

import sys

import torch
import torch.multiprocessing as mp
from common import model


def train(rank, net):
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for _ in range(12):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(torch.randn(16, 32)), torch.randn(16, 1)).backward()
        opt.step()


if __name__ == "__main__":
    mp.set_start_method(sys.argv[1], force=True)
    net = model()
    net.share_memory()
    procs = [mp.Process(target=train, args=(r, net)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    print("exit codes", [p.exitcode for p in procs], flush=True)
