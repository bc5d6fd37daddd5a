"""``kinetoscope capture [options] -- python train.py ARGS``: profile an unmodified script."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from kinetoscope.errors import ConfigError, KinetoscopeError

SITE_DIR = Path(__file__).resolve().parent / "_site"


def add_capture_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "capture",
        help="profile an unmodified training script (one profiler step per optimizer step)",
        description=(
            "Run COMMAND with torch.profiler attached: every optimizer.step() ends a profiler step, the "
            "schedule picks which steps are recorded, and each rank writes "
            "rank-<r>.step-<a>-<b>.pt.trace.json.gz plus a manifest into --out. Works under torchrun. "
            "Example: kinetoscope capture --out traces -- python train.py --epochs 1"
        ),
    )
    p.add_argument("--out", default="kinetoscope_traces", help="output directory (default kinetoscope_traces)")
    p.add_argument("--skip-first", type=int, default=1, help="steps to ignore first (default 1)")
    p.add_argument("--wait", type=int, default=1, help="idle steps before each window (default 1)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps before recording (default 1)")
    p.add_argument("--active", type=int, default=3, help="steps recorded per window (default 3)")
    p.add_argument("--repeat", type=int, default=1, help="windows to record, 0 = until the end (default 1)")
    p.add_argument("--no-memory", action="store_true", help="do not record allocator events")
    p.add_argument("--record-shapes", action="store_true", help="record input shapes")
    p.add_argument("--with-stack", action="store_true", help="record Python stacks (larger traces)")
    p.add_argument("--no-telemetry", action="store_true", help="do not sample GPU telemetry through NVML")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the training command")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run_capture)


def run_capture(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("capture needs a command after '--', e.g. kinetoscope capture -- python train.py")
    for name in ("skip_first", "wait", "warmup", "active", "repeat"):
        if getattr(args, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0")
    if args.active < 1:
        raise ConfigError("--active must be >= 1")
    config = {
        "out_dir": str(Path(args.out).resolve()),
        "schedule": {"skip_first": args.skip_first, "wait": args.wait, "warmup": args.warmup,
                     "active": args.active, "repeat": args.repeat},
        "options": {"profile_memory": not args.no_memory, "record_shapes": args.record_shapes,
                    "with_stack": args.with_stack, "telemetry": not args.no_telemetry},
    }
    env = dict(os.environ)
    env["KINETOSCOPE_CAPTURE"] = json.dumps(config)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), env.get("PYTHONPATH", "")) if p)
    try:
        completed = subprocess.run(command, env=env, check=False)
    except FileNotFoundError:
        raise KinetoscopeError(f"command not found: {command[0]}") from None
    if completed.returncode == 0:
        sys.stderr.write(f"kinetoscope: traces in {config['out_dir']}; analyse with: kinetoscope analyze {args.out}\n")
    return completed.returncode
