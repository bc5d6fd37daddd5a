"""Trains, then starts another Python program that imports torch: an evaluation script as a subprocess, or
(--exec) in place of this one. Only this training run is profiled. Usage: trains_then_runs.py STEPS [--exec]"""

import os
import subprocess
import sys

import torch
from common import model, say

HERE = os.path.dirname(os.path.abspath(__file__))
net = model()
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for _ in range(int(sys.argv[1])):
    opt.zero_grad()
    torch.nn.functional.mse_loss(net(torch.randn(16, 32)), torch.randn(16, 1)).backward()
    opt.step()
child = [sys.executable, os.path.join(HERE, "manual_sgd.py"), "9"]  # it trains too: 9 steps of its own
if "--exec" in sys.argv:
    os.execv(sys.executable, child)
subprocess.run(child, check=True)
say("done")
