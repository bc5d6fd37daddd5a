"""A loop with no torch.optim and no DataLoader (pytorch/examples' regression and word language model
update parameters by hand)."""

import sys

import torch
from common import model, say

net = model()
for step in range(int(sys.argv[1])):
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    net.zero_grad()
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    with torch.no_grad():
        for p in net.parameters():
            p -= 0.01 * p.grad
    say(f"step {step}")
