"""A closure optimizer: LBFGS evaluates the model several times inside each optimizer.step(closure)."""

import sys

import torch
from common import model, say

net = model()
opt = torch.optim.LBFGS(net.parameters(), lr=0.1, max_iter=4)
x, y = torch.randn(64, 32), torch.randn(64, 1)
evaluations = 0


def closure():
    global evaluations
    evaluations += 1
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    return loss


for step in range(int(sys.argv[1])):
    opt.step(closure)
    say(f"step {step}")
say(f"evaluations {evaluations}")
