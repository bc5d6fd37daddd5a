"""Capture overhead on a small CPU training loop (a benchmark, not a test).

Reports the median step time of:
  bare                 the loop alone
  capture, idle        inside kinetoscope.capture.profile_loop, outside any active window
                       (host step timing + data-wait timing + a started-but-idle profiler)
  torch.profiler       bare torch.profiler.profile, active steps (CPU, profile_memory=True)
  capture, active      kinetoscope Profiler, active steps, same options
Run: python benchmarks/capture_overhead.py [STEPS]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

from kinetoscope.capture import Profiler, Schedule, profile_loop

DIM, BATCH = 512, 256


def make():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(DIM, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1))
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    data = [(torch.randn(BATCH, DIM), torch.randn(BATCH, 1)) for _ in range(4)]
    return net, opt, data


def step(net, opt, x, y):
    loss = nn.functional.mse_loss(net(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def batches(data, n):
    for i in range(n):
        yield data[i % len(data)]


def bare(n):
    net, opt, data = make()
    times = []
    for x, y in batches(data, n):
        t = time.perf_counter()
        step(net, opt, x, y)
        times.append(time.perf_counter() - t)
    return times


def capture_idle(n):
    net, opt, data = make()
    times = []
    with tempfile.TemporaryDirectory() as out:
        sched = Schedule(skip_first=10 * n, wait=1, warmup=1, active=1)  # never reaches a window
        last = time.perf_counter()
        for x, y in profile_loop(batches(data, n), out, schedule=sched, telemetry=False):
            step(net, opt, x, y)
            now = time.perf_counter()
            times.append(now - last)  # includes the wrapper's own per-step work
            last = now
    return times[1:]


def _profiled_steps(prof, net, opt, data, n):
    """Each step's seconds, the profiler stepped after each (its own cost included)."""
    times = []
    for x, y in batches(data, n):
        t = time.perf_counter()
        step(net, opt, x, y)
        prof.step()
        times.append(time.perf_counter() - t)
    return times


def torch_active(n):
    net, opt, data = make()
    with tempfile.TemporaryDirectory() as out:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                     schedule=schedule(wait=0, warmup=1, active=n - 1, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/t.json")) as prof:
            times = _profiled_steps(prof, net, opt, data, n)
    return times[1:-1]


def capture_active(n):
    net, opt, data = make()
    with tempfile.TemporaryDirectory() as out:
        with Profiler(out, schedule=Schedule(skip_first=0, wait=0, warmup=1, active=n - 1), telemetry=False) as prof:
            times = _profiled_steps(prof, net, opt, data, n)
    return times[1:-1]


def main(n: int) -> None:
    torch.set_num_threads(1)
    bare(20)  # warm up
    rows = []
    for name, fn in (("bare", bare), ("capture, idle", capture_idle), ("torch.profiler, active", torch_active),
                     ("capture, active", capture_active)):
        medians = [statistics.median(fn(n)) * 1e3 for _ in range(3)]
        rows.append((name, statistics.median(medians)))
    base = rows[0][1]
    torch_ms = rows[2][1]
    print(f"{'run':<24} {'median step ms':>15} {'vs bare':>9} {'vs torch.profiler':>18}")
    for name, ms in rows:
        vs_torch = f"{ms / torch_ms - 1:+.1%}" if "active" in name else ""
        print(f"{name:<24} {ms:>15.3f} {ms / base - 1:>+9.1%} {vs_torch:>18}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
