"""A script that runs torch.profiler itself (capture must stand aside: two profilers at once crash torch)."""

import sys

import torch
from common import model, say
from torch.profiler import ProfilerActivity, profile

net = model()
opt = torch.optim.SGD(net.parameters(), lr=0.01)


def step():
    opt.zero_grad()
    torch.nn.functional.mse_loss(net(torch.randn(16, 32)), torch.randn(16, 1)).backward()
    opt.step()


for _ in range(6):  # capture starts during these
    step()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(4):
        step()
prof.export_chrome_trace(sys.argv[1])
for _ in range(4):
    step()
say("done")
