"""``kinetoscope capture [options] -- python train.py ARGS``: profile an unmodified script."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kinetoscope.errors import ConfigError, KinetoscopeError

if TYPE_CHECKING:
    from kinetoscope.sources import RemotePath

SITE_DIR = Path(__file__).resolve().parent / "_site"


def add_capture_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capture",
        help="profile an unmodified training script (one profiler step per optimizer step)",
        description=(
            "Run COMMAND with torch.profiler attached: every training step (an optimizer.step() of any optimizer, "
            "or the DataLoader iteration when several optimizers step in one (a GAN), or the first optimizer "
            "step after each backward() when several step after one and no DataLoader runs, else a DataLoader "
            "iteration, else a backward(), or kinetoscope.capture.mark_step()) ends a profiler step, the schedule "
            "picks which steps are recorded, and each rank writes rank-<r>.step-<a>-<b>.pt.trace.json.gz plus a "
            "manifest into --out (an earlier run's files there are moved aside). Works under torchrun. Signals "
            "reach the command, and its exit status is kept. "
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
    p.add_argument("--hang-timeout", type=float, default=None, metavar="SECONDS",
                   help="write each rank's hang dump (rank-<r>.hang.json: flight recorder, Python stacks, steps) when "
                        "no step ended for this long (default: the larger of 300 s and 20 median steps; before the "
                        "first step, at least 300 s; 0: only on SIGUSR1, SIGTERM or an exception)")
    p.add_argument("--flight-recorder-entries", type=int, default=2000, metavar="N",
                   help="collectives torch's flight recorder keeps per rank (default 2000; 0: off); a "
                        "TORCH_FR_BUFFER_SIZE of your own wins")
    p.add_argument("--no-hang-watch", action="store_true",
                   help="no watchdog and no hang dumps (the flight recorder is left as torch sets it)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the training command")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run_capture)


def run_capture(args: argparse.Namespace) -> int:
    from kinetoscope.capture.output import tidy_output_dir  # here, not at the top: every command lists capture

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
    if args.hang_timeout is not None and not args.hang_timeout >= 0:
        raise ConfigError("--hang-timeout must be >= 0 seconds")
    if args.flight_recorder_entries < 0:
        raise ConfigError("--flight-recorder-entries must be >= 0")
    # --out as a URL: the run writes into a local staging folder, and this process uploads each file once written
    # (kinetoscope/capture/upload.py); the training job never imports fsspec
    remote = _remote_out(args.out)
    staging = Path(tempfile.mkdtemp(prefix="kinetoscope-capture-")) if remote is not None else None
    config: dict[str, Any] = {
        "out_dir": str(staging if staging is not None else Path(args.out).resolve()),
        "schedule": {"skip_first": args.skip_first, "wait": args.wait, "warmup": args.warmup,
                     "active": args.active, "repeat": args.repeat},
        "options": {"profile_memory": not args.no_memory, "record_shapes": args.record_shapes,
                    "with_stack": args.with_stack, "telemetry": not args.no_telemetry},
        "hang": {"off": args.no_hang_watch, "timeout_s": args.hang_timeout,
                 "flight_recorder_entries": args.flight_recorder_entries},
    }
    out = Path(config["out_dir"])
    _check_writable(out)
    tidy_output_dir(out)  # what an earlier, killed run left: recovered (then moved aside with that run) or removed
    moved = _move_previous_run(out)
    if moved is not None:
        sys.stderr.write(f"kinetoscope: {out} held an earlier run's files: moved to {moved.name}/\n")
    env = dict(os.environ)
    env["KINETOSCOPE_CAPTURE"] = json.dumps(config)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), env.get("PYTHONPATH", "")) if p)
    env["KINETOSCOPE_CAPTURE_PARENT"] = str(os.getpid())  # the launched process is the one profiled
    if not args.no_hang_watch and not (
            "TORCH_FR_BUFFER_SIZE" in env or "TORCH_NCCL_TRACE_BUFFER_SIZE" in env):
        env["TORCH_FR_BUFFER_SIZE"] = str(args.flight_recorder_entries)  # read when a process group is made
    # Kineto prints "USDT: ... profiler_start/stop" to the training log at every window; set KINETO_LOG_LEVEL
    # yourself (e.g. 2) to see the profiler's own messages
    env.setdefault("KINETO_LOG_LEVEL", "6")
    uploader = None
    if remote is not None:
        from kinetoscope.capture.upload import Uploader

        uploader = Uploader(out, remote).start()
    code = _run_like_a_shell(command, env)
    statuses = _read_statuses(out)
    # every writer has exited: a raw export the writer thread was gzipping when the run was killed is kept
    # (uncompressed, without telemetry), half-written files go
    recovered, removed = tidy_output_dir(out, writers_gone=True)
    traces = _traces(out)
    dumps = sorted(out.glob("rank-*.hang.json")) if out.is_dir() else []
    if dumps:
        sys.stderr.write(f"kinetoscope: {len(dumps)} hang dump{'s' if len(dumps) != 1 else ''} in {out} "
                         f"({', '.join(p.name for p in dumps)}); analyse with: "
                         f"kinetoscope analyze {remote or args.out}\n")
    if traces:
        sys.stderr.write(f"kinetoscope: {len(traces)} trace{'s' if len(traces) != 1 else ''} in {out}; "
                         f"analyse with: kinetoscope analyze {remote or args.out}\n")
    elif not dumps:
        sys.stderr.write(f"kinetoscope: no trace written: {_why_no_trace(out, code, statuses)}\n")
    if recovered:
        sys.stderr.write(f"kinetoscope: the run ended while {len(recovered)} trace(s) were being compressed; kept "
                         f"uncompressed, without GPU telemetry: {', '.join(p.name for p in recovered)}\n")
    if removed:
        sys.stderr.write(f"kinetoscope: removed {removed} unfinished temporary file(s) from {out}\n")
    if uploader is not None:
        uploaded = uploader.finish()  # what is left, the manifests last: they say the run is over
        sys.stderr.write(f"kinetoscope: uploaded {len(uploaded)} file(s) to {remote}"
                         + (f"; analyse with: kinetoscope analyze {remote}\n" if traces else "\n"))
        for problem in uploader.errors:
            sys.stderr.write(f"kinetoscope: upload failed: {problem}\n")
        if uploader.errors:
            sys.stderr.write(f"kinetoscope: the run's files are kept in {out}\n")
        else:
            shutil.rmtree(out, ignore_errors=True)
    return code


def _remote_out(out: str) -> RemotePath | None:
    """``--out`` as a store's prefix, checked to be reachable and empty (an earlier run's objects are not moved
    aside in a bucket, and a watch must not take them for this run's); None for a local folder."""
    from kinetoscope.sources import RemotePath, is_url

    if not is_url(out):
        return None
    dest = RemotePath(out)
    try:
        held = dest.exists() and dest.is_dir() and any(True for _ in dest.iterdir())
    except OSError as exc:
        raise ConfigError(f"cannot write to --out {dest} ({exc.strerror or exc})") from None
    if held:
        raise ConfigError(f"--out {dest} already holds files (an earlier run?): give an empty prefix")
    return dest


def _traces(out: Path) -> list[Path]:
    if not out.is_dir():
        return []
    return sorted(p for p in out.iterdir() if p.is_file() and p.name.endswith((".pt.trace.json.gz", ".pt.trace.json")))


def _run_like_a_shell(command: list[str], env: dict[str, str]) -> int:
    """Run the command and wait for it as a shell does: Ctrl-C reaches it from the terminal (it is in our
    process group) and is not ours to act on; SIGTERM/SIGHUP sent to us are passed on; its exit status is
    ours, 128 + N when a signal N ended it (130 SIGINT, 143 SIGTERM, 139 SIGSEGV)."""
    try:
        child = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        raise KinetoscopeError(f"command not found: {command[0]}") from None
    except PermissionError:
        raise KinetoscopeError(f"command not executable: {command[0]}") from None
    forwarded = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
    previous = {}
    for sig in forwarded:
        previous[sig] = signal.signal(sig, lambda signum, frame: child.send_signal(signum))

    def on_int(signum: int, frame: object) -> None:
        # Ctrl-C at the terminal reaches the child itself (same foreground process group): passing it on would
        # interrupt the script's own clean-up. A SIGINT sent to us alone (kill -INT, timeout -s INT) is passed on.
        if not _terminal_sent_it():
            child.send_signal(signal.SIGINT)

    previous[signal.SIGINT] = signal.signal(signal.SIGINT, on_int)
    try:
        while True:
            try:
                status = child.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status if status >= 0 else 128 - status


def _terminal_sent_it() -> bool:
    """Whether a SIGINT we got came from our terminal's Ctrl-C: we run in its foreground process group."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


def _check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".kinetoscope-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write to --out {out} ({exc.strerror or exc})") from None


def _read_statuses(out: Path) -> list[dict[str, Any]]:
    """What each process the command started told capture (see ``auto.status``)."""
    found = []
    for p in sorted(out.glob(".kinetoscope-status-*.json")) if out.is_dir() else []:
        try:
            found.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return found


def _move_previous_run(out: Path) -> Path | None:
    """An earlier run's traces and sidecars in ``out`` go to ``out/previous-<time>/``: never mixed with this run's."""
    if not out.is_dir():
        return None
    old = [p for p in out.iterdir() if p.is_file() and p.name.endswith(
        (".pt.trace.json.gz", ".pt.trace.json", ".manifest.json", ".steps.json", ".hang.json"))]
    if not old:
        return None
    target = out / time.strftime("previous-%Y%m%d-%H%M%S", time.localtime(max(p.stat().st_mtime for p in old)))
    n = 1
    while target.exists():
        n += 1
        target = target.with_name(f"{target.name.split('~')[0]}~{n}")
    target.mkdir()
    for p in old:
        p.rename(target / p.name)
    return target


def _why_no_trace(out: Path, code: int, statuses: list[dict[str, Any]] | None = None) -> str:
    statuses = statuses or []
    manifests = sorted(out.glob("rank-*.manifest.json")) if out.is_dir() else []
    aside = next((s["stood_aside"] for s in statuses if s.get("stood_aside")), None)
    if aside:
        return f"capture stood aside ({aside}; two profilers at once crash torch)"
    if not statuses:
        return ("capture never reached the command: it does not start Python, or Python runs with -I or -E "
                "(which ignore PYTHONPATH, where capture hooks in)")
    steps = max((int(s.get("steps", 0) or 0) for s in statuses), default=0)
    profiled = any("steps" in s for s in statuses)
    if code != 0:
        if manifests:
            return f"the command exited with status {code} before a profiled window completed"
        if profiled and steps:
            return (f"the command exited with status {code} after at least {steps} training step(s), "
                    "before a profiled window completed")
        return f"the command exited with status {code} before its first training step"
    if manifests:
        try:
            doc = json.loads(manifests[0].read_text())
            runs = doc.get("steps_run")
            return (f"the run had {runs} training step(s), fewer than the schedule needs before recording "
                    "(lower --skip-first/--wait/--warmup)")
        except (OSError, ValueError):
            pass
    if not any(s.get("torch") for s in statuses):
        return "the command never imported torch"
    return ("no training step was seen (no torch.optim step, DataLoader iteration or backward(), and no "
            "kinetoscope.capture.mark_step() call, in the launched process, torchrun's workers or "
            "torch.multiprocessing.spawn's ranks; other child processes are not profiled)")
