"""A training loop whose every loop event is known by construction, for the loop marks (issue 28).

T optimizer steps of ACC micro-steps each (one train batch and one backward() per micro-step); after every V-th
optimizer step a validation pass (model.eval(), torch.no_grad(), every batch of a val loader of M batches, then
model.train()); a torch.save after each optimizer step listed in --save-at (torch.distributed.checkpoint.save:
--dcp-at); with --compile, the model runs through
torch.compile(backend="eager") and the micro-step at --recompile-at (optimizer step, first micro-step) takes half a
batch: one recompile. The loop takes its train batches with next() from one iterator (no epoch end inside).

Usage: loop_marks.py MODE [--steps T] [--acc ACC] [--every V] [--val-batches M] [--save-at K ...] [--compile]
  [--recompile-at K] [--out DIR] [any other arguments, ignored: --api-key sk-... on the command line]
MODE: "auto" (run under kinetoscope capture: nothing of Kinetoscope in the script), "profiler" (Profiler, one
prof.step() after each optimizer step), "profile_loop" (profile_loop over the train loader: one step per batch).
Prints "hooks restored: True" when, after the Profiler, every function the loop recorder patched is torch's again;
under capture, how many wrappers lie over DataLoader.__next__ and autograd.backward ("wrappers: 1 1": one set of
hooks); and whether pandas was imported (the capture must not need it).
"""

import argparse
import os
import tempfile

import torch

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=("auto", "profiler", "profile_loop"))
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--acc", type=int, default=4)
ap.add_argument("--every", type=int, default=4)
ap.add_argument("--val-batches", type=int, default=3)
ap.add_argument("--save-at", type=int, nargs="*", default=[])
ap.add_argument("--dcp-at", type=int, nargs="*", default=[])
ap.add_argument("--compile", action="store_true")
ap.add_argument("--recompile-at", type=int, default=-1)
ap.add_argument("--out", default="")
ap.add_argument("--active", type=int, default=3)
# end validation as Lightning does: module.training = True
ap.add_argument("--restore-by-attribute", action="store_true")
args, _ = ap.parse_known_args()
torch.set_num_threads(1)
if args.dcp_at:
    import warnings

    import torch.distributed.checkpoint as dcp

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process: no process group

BATCH = 16
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(BATCH * args.steps * args.acc, 32),
                                                                   torch.randn(BATCH * args.steps * args.acc, 1)),
                                    batch_size=BATCH)
val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(BATCH * args.val_batches, 32),
                                                                 torch.randn(BATCH * args.val_batches, 1)),
                                  batch_size=BATCH)
run = torch.compile(model, backend="eager") if args.compile else model
checkpoint = os.path.join(tempfile.mkdtemp(), "ck.pt")


def micro_step(step, k, x, y):
    if step == args.recompile_at and k == 0:
        x, y = x[: BATCH // 2], y[: BATCH // 2]  # another shape, once
    loss = torch.nn.functional.mse_loss(run(x), y) / args.acc
    loss.backward()


def after_optimizer_step(step):
    if (step + 1) % args.every == 0:
        model.eval()
        with torch.no_grad():
            for x, _ in val:
                model(x)
        if args.restore_by_attribute:  # no .train() call to see: the mode set on every module directly
            for m in model.modules():
                m.training = True
        else:
            model.train()
    if step in args.save_at:
        torch.save(model.state_dict(), checkpoint)
    if step in args.dcp_at:
        dcp.save({"model": model.state_dict()}, checkpoint_id=checkpoint + f".dcp{step}")


def loop(end_of_step=lambda: None):
    it = iter(train)
    for step in range(args.steps):
        for k in range(args.acc):
            x, y = next(it)
            micro_step(step, k, x, y)
        opt.step()
        opt.zero_grad()
        after_optimizer_step(step)
        end_of_step()


def patched():
    dl = torch.utils.data.dataloader
    return (dl._BaseDataLoaderIter.__next__, dl.DataLoader.__iter__, torch.nn.Module.train, torch.autograd.backward,
            torch.save, torch.compile)


def layers(fn):
    """How many wrappers (functools.wraps) lie over torch's own function."""
    n = 0
    while hasattr(fn, "__wrapped__"):
        fn, n = fn.__wrapped__, n + 1
    return n


if args.mode == "auto":
    loop()
    dl = torch.utils.data.dataloader
    print("wrappers:", layers(dl._BaseDataLoaderIter.__next__), layers(torch.autograd.backward), flush=True)
elif args.mode == "profiler":
    from kinetoscope.capture import Profiler, Schedule

    before = patched()
    with Profiler(args.out, schedule=Schedule(skip_first=1, wait=0, warmup=1, active=args.active),
                  telemetry=False) as prof:
        loop(prof.step)
    print("hooks restored:", all(a is b for a, b in zip(before, patched(), strict=True)), flush=True)
else:
    from kinetoscope.capture import Schedule, profile_loop

    before = patched()
    step = 0
    for i, (x, y) in enumerate(profile_loop(train, args.out, schedule=Schedule(skip_first=1, wait=0, warmup=1,
                                                                                  active=args.active),
                                            telemetry=False)):
        micro_step(step, i % args.acc, x, y)
        if i % args.acc == args.acc - 1:
            opt.step()
            opt.zero_grad()
            after_optimizer_step(step)
            step += 1
    print("hooks restored:", all(a is b for a, b in zip(before, patched(), strict=True)), flush=True)
import sys  # noqa: E402

print("pandas imported:", "pandas" in sys.modules, flush=True)
print("done", flush=True)
