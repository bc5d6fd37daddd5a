"""The ``kinetoscope`` command: one module per subcommand (``analyze``, ``diff``, ``whatif``, ``redact``, ``app``; the
capture and batch packages add theirs). Errors become one line on stderr and an exit code here, and only here.

``main(argv)`` runs a command in the caller's process and leaves that process as it is; ``run()`` is the command's
own process (the console script): only it applies the process settings of ``kinetoscope.cli.process`` and ends the
process without the interpreter's teardown.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from kinetoscope import __version__
from kinetoscope.cli import analyze, app, diff, redact, whatif
from kinetoscope.cli.output import EXIT_GATE, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, error, internal, unwritable
from kinetoscope.errors import KinetoscopeError, OutputError

__all__ = ["EXIT_GATE", "EXIT_INTERNAL", "EXIT_OK", "EXIT_USAGE", "build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kinetoscope",
        description="Find what makes PyTorch training steps slow, from Kineto (torch.profiler) traces.",
    )
    parser.add_argument("--version", action="version", version=f"kinetoscope {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (analyze, diff, app, redact, whatif):
        command.add_parser(sub)
    _register_extra_commands(sub)
    return parser


def _register_extra_commands(sub: argparse._SubParsersAction) -> None:
    """Commands contributed by subpackages; their heavy imports (torch, Dask) happen only when they run."""
    from kinetoscope.batch.cli import add_batch_commands
    from kinetoscope.capture.cli import add_capture_command

    add_capture_command(sub)
    add_batch_commands(sub)


def main(argv: Sequence[str] | None = None) -> int:
    return _main(argv)[0]


def run() -> None:
    """The ``kinetoscope`` command's process. It sets what a process-wide setting must (before numpy or a thread
    starts), and a command that only reads and prints (analyze, diff, whatif) ends the process as soon as its output
    is flushed: tearing the interpreter down (pandas' modules, the trace's columns) took ~0.12 s of a 0.8 s analysis.
    Commands that start servers, clusters or child processes exit normally."""
    from kinetoscope.cli.process import one_malloc_arena, quiet_blas

    quiet_blas()
    one_malloc_arena()  # this process is ours, and no thread has started yet
    code, quick = _main(None, own_process=True)
    if not quick:
        sys.exit(code)
    os._exit(_flushed(code))


def _flushed(code: int) -> int:
    """``code`` once stdout and stderr are flushed; a failed write (a full disk) is an error, said on stderr if it
    can be; a reader that went away (a closed pipe) is not."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with the descriptor closed
            continue
        try:
            stream.flush()
        except BrokenPipeError:
            pass
        except OSError as exc:
            try:  # not through sys.stderr: it may be the stream that failed
                os.write(2, f"kinetoscope: error: {unwritable(exc)}\n".encode())
            except OSError:
                pass
            code = code if code not in (EXIT_OK, EXIT_GATE) else OutputError.exit_code
    return code


def _main(argv: Sequence[str] | None, own_process: bool = False) -> tuple[int, bool]:
    """(exit status, whether the process may end without the interpreter's teardown). ``own_process``: the command's
    own process (``run``), whose imports it may choose; never so for ``main``, called from someone else's."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.own_process = own_process
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE, False
    return _call(func, args), getattr(args, "quick_exit", False)


def _call(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return func(args)
    except KinetoscopeError as exc:
        error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        internal(exc, args.debug)
        return EXIT_INTERNAL
