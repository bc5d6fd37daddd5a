"""What every command shares for its output: exit codes, standard output written plainly, one-line errors."""

from __future__ import annotations

import sys
import traceback

from kinetoscope.errors import OutputError

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_GATE = 0, 1, 2, 3
SEVERITY_LEVEL = {"info": 2, "warning": 1, "critical": 0}


def write(text: str) -> None:
    """Write to standard output; a closed or full output is said plainly (exit 2), not as an internal error."""
    if sys.stdout is None:
        raise OutputError("cannot write the output (standard output is closed)")
    try:
        sys.stdout.write(text)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise unwritable(exc) from None


def unwritable(exc: OSError) -> OutputError:
    return OutputError(f"cannot write the output ({exc.strerror or exc})")


def error(message: str) -> None:
    sys.stderr.write(f"kinetoscope: error: {message}\n")


def internal(exc: BaseException, debug: bool, context: str = "") -> None:
    where = f"{context}: " if context else ""
    error(f"{where}internal error ({type(exc).__name__}: {exc}); rerun with --debug and report it")
    if debug:
        traceback.print_exception(exc)
