"""Training loops with several optimizers, or training in child processes, whose steps are known by construction
(issue 28, item 1: the capture counts every optimizer and notices training it does not follow).

Usage: multi_optimizer.py MODE [--batches N] [--epochs E] [--layers L] [--test-batches M] [--workers W]
MODE:
  "gan": a GAN-like loop over a DataLoader of N batches: per batch, D's two backward() calls (real, fake) and
         D's optimizer step, then G's one backward() and G's optimizer step (two Adam optimizers, D then G);
         the DataLoader has W worker processes (default 0).
  "per_layer": forward-forward-like: one batch taken with next(iter(loader)), then L layers trained in turn, each
         by its own Adam for E epochs (one backward() and one step() per epoch): L * E optimizer steps, one after
         another, no DataLoader iteration between them.
  "two_after_backward": N iterations without a DataLoader: a forward, one backward(), then two optimizers
         (SGD for the first layer, Adam for the second, in that order) each step once.
  "val_then_two": a validation pass over a DataLoader of 3 batches under torch.no_grad(), then "two_after_backward".
  "two_then_lbfgs": 3 iterations of "two_after_backward", then E LBFGS steps (max_iter 2) whose closure runs the
         forward and backward() inside the optimizer step.
  "late_second": N iterations of one backward() then SGD's step; from iteration N - 2 on Adam steps after SGD too.
  "hogwild": a shared model trained by 2 processes started with the "spawn" method (target ``train``: N batches
         each, backward() and SGD step per batch); the parent joins them, then evaluates it over a DataLoader of M
         batches with model.eval() and torch.no_grad(): the parent itself runs no backward() and no step().
Nothing of Kinetoscope in the script: it runs under ``kinetoscope capture``.
"""

import argparse

import torch

BATCH = 8


def make_loader(batches: int, features: int, workers: int = 0) -> torch.utils.data.DataLoader:
    data = torch.utils.data.TensorDataset(torch.randn(BATCH * batches, features), torch.randn(BATCH * batches, 1))
    return torch.utils.data.DataLoader(data, batch_size=BATCH, num_workers=workers)


def gan(args: argparse.Namespace) -> None:
    netD = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    netG = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
    optD = torch.optim.Adam(netD.parameters(), lr=1e-3)
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    for real, _ in make_loader(args.batches, 16, args.workers):
        netD.zero_grad()
        bce(netD(real), torch.ones(BATCH, 1)).backward()
        fake = netG(torch.randn(BATCH, 4))
        bce(netD(fake.detach()), torch.zeros(BATCH, 1)).backward()
        optD.step()
        netG.zero_grad()
        bce(netD(fake), torch.ones(BATCH, 1)).backward()
        optG.step()


def per_layer(args: argparse.Namespace) -> None:
    x, y = next(iter(make_loader(1, 16)))
    layers = [torch.nn.Linear(16, 16) for _ in range(args.layers)]
    for layer in layers:
        opt = torch.optim.Adam(layer.parameters(), lr=1e-3)
        for _ in range(args.epochs):
            opt.zero_grad()
            layer(x).pow(2).mean().backward()
            opt.step()
        x = layer(x).detach()


def two_after_backward(args: argparse.Namespace, iterations: int | None = None, second_from: int = 0) -> None:
    first, second = torch.nn.Linear(16, 16), torch.nn.Linear(16, 1)
    opt_a = torch.optim.SGD(first.parameters(), lr=1e-3)
    opt_b = torch.optim.Adam(second.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, 16), torch.randn(BATCH, 1)
    for i in range(args.batches if iterations is None else iterations):
        opt_a.zero_grad()
        opt_b.zero_grad()
        torch.nn.functional.mse_loss(second(torch.relu(first(x))), y).backward()
        opt_a.step()
        if i >= second_from:
            opt_b.step()


def val_then_two(args: argparse.Namespace) -> None:
    model = torch.nn.Linear(16, 1)
    with torch.no_grad():
        for x, y in make_loader(3, 16):
            torch.nn.functional.mse_loss(model(x), y)
    two_after_backward(args)


def two_then_lbfgs(args: argparse.Namespace) -> None:
    two_after_backward(args, iterations=3)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2)
    x, y = torch.randn(BATCH, 16), torch.randn(BATCH, 1)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(args.epochs):
        opt.step(closure)


def late_second(args: argparse.Namespace) -> None:
    two_after_backward(args, second_from=args.batches - 3)


def train(model: torch.nn.Module, batches: int, seed: int) -> None:
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    for x, y in make_loader(batches, 16):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def hogwild(args: argparse.Namespace) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model.share_memory()
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=train, args=(model, args.batches, rank)) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    model.eval()
    with torch.no_grad():
        for x, y in make_loader(args.test_batches, 16):
            torch.nn.functional.mse_loss(model(x), y)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("gan", "per_layer", "two_after_backward", "val_then_two", "two_then_lbfgs",
                                     "late_second", "hogwild"))
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--test-batches", type=int, default=6)
    ap.add_argument("--workers", type=int, default=0)  # gan: the DataLoader's worker processes
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    {"gan": gan, "per_layer": per_layer, "two_after_backward": two_after_backward, "val_then_two": val_then_two,
     "two_then_lbfgs": two_then_lbfgs, "late_second": late_second, "hogwild": hogwild}[args.mode](args)
