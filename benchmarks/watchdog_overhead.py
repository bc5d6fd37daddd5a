"""What the hang watchdog costs a training step (a benchmark, not a test).

Each run is a fresh process: a small CPU training loop (a 3-layer MLP, one thread) inside
``kinetoscope.capture.profile_loop`` outside any profiled window, with the watchdog armed (``hang_watch=True``:
its thread, the SIGUSR1/SIGTERM listeners, the exception hook) or not (``hang_watch=False``). Processes alternate
(off, armed, off, armed, ...) so a drift in the machine's load falls on both alike. Per process: the median step
(wall, host clock between iterations), the whole loop's wall time per step, and the process's CPU time per step
(every thread: the watchdog's wake-ups included), the training thread's own CPU time per step, and the watchdog
thread's CPU time over the whole run (Linux: /proc/self/task/<tid>/stat, in clock ticks of 10 ms). The CPU times
are what a loaded machine disturbs least: the wall times there move with the other processes. Reported per mode:
the median over processes and the spread (min-max) of each, and the load average before and after.

Run: python benchmarks/watchdog_overhead.py [--processes 8] [--steps 4000] [--hang-timeout SECONDS]
(``--hang-timeout 1``: the watchdog wakes every eighth of a second instead of once a second.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

DIM, BATCH = 256, 64
#: steps before the timing starts (the first steps warm up)
WARM = 20


def child(mode: str, steps: int, timeout_s: float | None) -> None:
    import torch
    from torch import nn

    from kinetoscope.capture import Schedule, profile_loop

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(DIM, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    data = [(torch.randn(BATCH, DIM), torch.randn(BATCH, 1)) for _ in range(4)]
    never = Schedule(skip_first=10 * steps, wait=1, warmup=1, active=1)  # no window: the watchdog is the difference
    times = []
    with tempfile.TemporaryDirectory() as out:
        loop = profile_loop((data[i % 4] for i in range(steps)), out, schedule=never, telemetry=False,
                            hang_watch=mode == "armed", hang_timeout_s=timeout_s)
        # timed from the end of the WARM-th step to the end of the last: the profiler's start and stop (once per
        # process, not per step) stay out
        last = t0 = c0 = h0 = t1 = c1 = h1 = 0.0
        watchdog_s = None
        for i, (x, y) in enumerate(loop):
            loss = nn.functional.mse_loss(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            now = time.perf_counter()
            if i == WARM - 1:
                t0, c0, h0 = now, time.process_time(), time.thread_time()
            elif i >= WARM:
                times.append(now - last)
            if i == steps - 1:
                t1, c1, h1 = now, time.process_time(), time.thread_time()
                watchdog_s = _watchdog_cpu_s()
            last = now
    timed = steps - WARM
    print(json.dumps({"mode": mode, "median_step_us": statistics.median(times) * 1e6,
                      "loop_wall_us_per_step": (t1 - t0) / timed * 1e6, "cpu_us_per_step": (c1 - c0) / timed * 1e6,
                      "training_thread_cpu_us_per_step": (h1 - h0) / timed * 1e6,
                      "watchdog_thread_cpu_ms": None if watchdog_s is None else watchdog_s * 1e3}))


def _watchdog_cpu_s() -> float | None:
    """The watchdog thread's CPU time since it started (user + system), or None: no watchdog, or not Linux."""
    import threading

    thread = next((t for t in threading.enumerate() if t.name == "kinetoscope-hangwatch"), None)
    if thread is None or thread.native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{thread.native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _summary(runs: list[dict], key: str) -> str:
    values = sorted(r[key] for r in runs)
    return f"{statistics.median(values):9.1f} ({values[0]:.1f}-{values[-1]:.1f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=8, help="processes per mode")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--hang-timeout", type=float, default=None)
    p.add_argument("--child", choices=("off", "armed"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.steps, args.hang_timeout)
        return
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {"off": [], "armed": []}
    for i in range(2 * args.processes):
        mode = ("off", "armed")[i % 2]
        cmd = [sys.executable, __file__, "--child", mode, "--steps", str(args.steps)]
        if args.hang_timeout is not None:
            cmd += ["--hang-timeout", str(args.hang_timeout)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        runs[mode].append(json.loads(out.strip().splitlines()[-1]))
    load_after = os.getloadavg()
    print(f"{args.processes} processes per mode x {args.steps} steps; --hang-timeout {args.hang_timeout or 'default'}; "
          f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} ({os.cpu_count()} cores)")
    keys = ("median_step_us", "loop_wall_us_per_step", "cpu_us_per_step", "training_thread_cpu_us_per_step")
    print("median over processes (min-max):")
    for key in keys:
        print(f"  {key:<34} off {_summary(runs['off'], key)}   armed {_summary(runs['armed'], key)}")
    for key in keys:
        off = statistics.median(r[key] for r in runs["off"])
        armed = statistics.median(r[key] for r in runs["armed"])
        print(f"armed vs off, {key}: {armed - off:+.1f} us ({armed / off - 1:+.2%})")
    watchdog = [r["watchdog_thread_cpu_ms"] for r in runs["armed"]]
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    print(f"watchdog thread CPU over each armed run (ms, ticks of {tick_ms:.0f} ms): {watchdog}")


if __name__ == "__main__":
    main()
