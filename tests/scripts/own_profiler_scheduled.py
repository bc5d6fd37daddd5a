"""The tutorial pattern: torch.profiler with a schedule, entered before the first step (capture's own profiler
is not running yet; the script's enables itself later, at one of its own steps). Usage: own_profiler_scheduled.py OUT"""

import sys

import torch
from common import model, say
from torch.profiler import ProfilerActivity, profile, schedule

net = model()
opt = torch.optim.SGD(net.parameters(), lr=0.01)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=2, warmup=1, active=3),
             on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(10):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(torch.randn(16, 32)), torch.randn(16, 1)).backward()
        opt.step()
        prof.step()
say("done")
