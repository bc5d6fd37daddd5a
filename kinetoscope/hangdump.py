"""The hang dump contract: what a capture writes for a rank when its job stops moving, and what analysis reads back.
Beside ``manifest``, for both sides; light (msgspec and the standard library: a training job imports it).

``rank-<r>.hang.json`` (``HangDump``), written by the capture's watchdog (``capture/hangwatch.py``) when no step
ended for the hang timeout, on SIGTERM, on SIGUSR1 and on an uncaught exception; the latest replaces the earlier
(write and rename). It holds the rank's flight recorder (torch's ring buffer of its recent collectives, as torch's
own JSON), the Python stacks of every thread, the step reached and the recent steps' timings. Never a pickle.
"""

from __future__ import annotations

from typing import Any

import msgspec

#: 1: the first version
HANG_DUMP_VERSION = 1
HANG_SUFFIX = ".hang.json"


def hang_dump_name(rank: int) -> str:
    return f"rank-{rank}{HANG_SUFFIX}"


class Frame(msgspec.Struct, kw_only=True):
    """One frame of a Python stack: the file, the line, the function and the line's text."""

    file: str
    line: int | None = None
    function: str
    code: str | None = None


class ThreadStack(msgspec.Struct, kw_only=True):
    """A thread's stack when the dump was written, innermost frame first (at most ``MAX_FRAMES``)."""

    ident: int
    name: str | None = None
    #: the thread that ran the training steps
    training: bool = False
    frames: list[Frame] = []
    #: frames left out beyond the innermost ``MAX_FRAMES``
    frames_omitted: int = 0


class RaisedException(msgspec.Struct, kw_only=True):
    """An exception that ended the training thread: its type, message and traceback, innermost frame first."""

    type: str
    message: str
    frames: list[Frame] = []


class HangDump(msgspec.Struct, kw_only=True):
    """``rank-<r>.hang.json``."""

    hang_dump_version: int = HANG_DUMP_VERSION
    rank: int
    world_size: int | None = None
    local_rank: int | None = None
    pid: int
    #: what wrote it: "watchdog" (no step ended for ``timeout_s``), "SIGTERM", "SIGUSR1", "exception"
    reason: str
    written_unix_ns: int
    #: the watchdog's timeout in force; None: no watchdog (a signal or an exception wrote it)
    timeout_s: float | None = None
    #: training steps ended so far; None: the capture saw no step boundary yet
    steps_ended: int | None = None
    #: seconds since the last step ended (or since the watchdog started, before the first step)
    seconds_since_progress: float
    #: the last steps' wall times (ns), oldest first (at most ``MAX_STEP_TIMES``)
    recent_step_wall_ns: list[int] = []
    median_step_ns: int | None = None
    threads: list[ThreadStack] = []
    threads_omitted: int = 0
    exception: RaisedException | None = None
    #: torch's flight recorder, as ``torch._C._distributed_c10d._dump_fr_trace_json`` gives it; None: not read
    flight_recorder: dict[str, Any] | None = None
    #: why the flight recorder is missing or empty (no process group, recorder off, an error); None: read
    flight_recorder_note: str | None = None
    #: the recorder's capacity (entries) in force: TORCH_FR_BUFFER_SIZE; None: unknown
    flight_recorder_entries: int | None = None

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)


def fr_op(entry: dict[str, Any]) -> str:
    """A flight recorder entry's op: its ``profiling_name`` without the backend (``gloo:all_reduce``)."""
    name = str(entry.get("profiling_name") or "")
    return name.split(":", 1)[1] if ":" in name else name


def fr_completed(entry: dict[str, Any]) -> bool:
    """Whether a flight recorder entry's collective completed (its state, or retired from the work queue)."""
    return entry.get("state") == "completed" or entry.get("retired") is True


#: bounds that keep a dump small and quick to write
MAX_THREADS = 64
MAX_FRAMES = 48
MAX_TEXT = 400
MAX_STEP_TIMES = 100

#: the first byte of a pickle (protocol 2 and later): torch's own flight recorder dumps are pickles
PICKLE_MAGIC = b"\x80"
PICKLE_REFUSED = ("is a pickled flight recorder dump: Kinetoscope never unpickles; run the job under "
                  "'kinetoscope capture' (it writes rank-<r>.hang.json), or write JSON yourself with "
                  "torch._C._distributed_c10d._dump_fr_trace_json()")
