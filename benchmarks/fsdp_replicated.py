"""FSDP2 as written against the same program replicated (DDP), run alternately without the profiler.

The measurement behind ``exposed_comm``'s replicate estimate (docs/findings.md; docs/expert-readings.md, "FSDP on a
host its ranks fill, settled by measurement"). Each program is a 2-rank FSDP2 training script whose root module is
wrapped by a line of its own, ``fully_shard(model)`` (optionally ``mesh=mesh``), like the held-out captures' programs
(their RUN.md holds them). Its DDP variant replaces that line with ``model = DistributedDataParallel(model)`` and
every other ``fully_shard(...)`` call with a no-op; nothing else changes. Each run's mean time between optimizer
steps after the first five is timed on rank 0 (a global optimizer step hook: the program is not edited for it).

    python benchmarks/fsdp_replicated.py --rounds 5 prog1.py prog2.py ...

Prints, per program, each round's mean step (ms) as written and as DDP and the paired change. Set OMP_NUM_THREADS=1
as the captures did; run on a quiet machine (runs alternate, so load that drifts hits both alike).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TIMER = '''
import atexit, os, time
import torch.optim.optimizer as _oo
import torch.distributed as _dist
_t = []
_oo.register_optimizer_step_post_hook(lambda opt, args, kwargs: _t.append(time.perf_counter()))
_done = []
def _report():
    if _done or os.environ.get("RANK", "0") != "0":
        return
    _done.append(1)
    d = [b - a for a, b in zip(_t, _t[1:])][5:]
    if d:
        with open(os.environ["FSDP_REPLICATED_OUT"], "a") as f:
            f.write(f"{sum(d) / len(d) * 1000:.3f}\\n")
_destroy = _dist.destroy_process_group
def _destroy_after_report(*a, **k):
    _report()
    return _destroy(*a, **k)
_dist.destroy_process_group = _destroy_after_report
atexit.register(_report)
'''

ROOT_WRAP = re.compile(r"^(\s*)fully_shard\(model(, mesh=mesh)?\)\s*$")


def replicated(source: str) -> str:
    """``source`` with its root ``fully_shard(model)`` replaced by DDP and every other ``fully_shard`` call a no-op."""
    out, roots = [], 0
    for line in source.splitlines():
        m = ROOT_WRAP.match(line)
        if m:
            out.append(f"{m.group(1)}model = __import__('torch').nn.parallel.DistributedDataParallel(model)")
            roots += 1
        elif "import" not in line:
            out.append(line.replace("fully_shard(", "(lambda *a, **k: None)("))
        else:
            out.append(line)
    if roots != 1:
        raise SystemExit(f"expected one line 'fully_shard(model)', found {roots}")
    return "\n".join(out) + "\n"


def run(program: Path, work: Path, timeout_s: float) -> float | None:
    """One torchrun of ``program`` on 2 ranks: its mean step (ms) on rank 0, or None if it did not report."""
    out = work / "out.txt"
    out.unlink(missing_ok=True)
    env = {**os.environ, "FSDP_REPLICATED_OUT": str(out), "PYTHONPATH": str(work)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(program)]
    err = ""
    try:
        done = subprocess.run(cmd, env=env, cwd=work, timeout=timeout_s, capture_output=True, text=True, check=False)
        err = done.stderr
    except subprocess.TimeoutExpired:
        pass  # a job that hangs at exit has reported already
    if not out.exists():
        tail = "\n".join(err.strip().splitlines()[-5:])
        print(f"{program.name}: no step time reported{': ' + tail if tail else ''}", file=sys.stderr)
        return None
    return float(out.read_text().split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("programs", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "step_timer.py").write_text(TIMER)
        variants = {}
        for p in args.programs:
            src = "import step_timer\n" + p.read_text()
            (work / f"{p.stem}__sharded.py").write_text(src)
            (work / f"{p.stem}__ddp.py").write_text(replicated(src))
            variants[p.stem] = (work / f"{p.stem}__sharded.py", work / f"{p.stem}__ddp.py")
        times: dict[str, list[tuple[float | None, float | None]]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, (a, b) in variants.items():
                times[name].append((run(a, work, args.timeout), run(b, work, args.timeout)))
    print("| program | as written (ms, per round) | as DDP (ms, per round) | mean as written | mean as DDP | "
          "paired change (median) | rounds DDP faster |")
    print("|---|---|---|---|---|---|---|")
    for name, pairs in times.items():
        ok = [(a, b) for a, b in pairs if a is not None and b is not None]
        if not ok:
            print(f"| {name} | no run reported | | | | | |")
            continue
        change = statistics.median(b / a - 1 for a, b in ok)
        print(f"| {name} | {', '.join(f'{a:.1f}' for a, _ in ok)} | {', '.join(f'{b:.1f}' for _, b in ok)} | "
              f"{statistics.mean(a for a, _ in ok):.1f} | {statistics.mean(b for _, b in ok):.1f} | {change:+.1%} | "
              f"{sum(b < a for a, b in ok)} of {len(ok)} |")


if __name__ == "__main__":
    main()
