"""Limits that keep a hostile or broken trace from taking unbounded time or memory."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kinetoscope.errors import ConfigError, TraceFormatError


@dataclass(frozen=True)
class LoadLimits:
    #: gunzipped size; guards against gzip bombs (a 5-step 7B-model trace is ~4 GB)
    max_decompressed_bytes: int = 8 * 2**30
    #: trace events in one file (a 4 GB trace holds ~20 M)
    max_events: int = 200_000_000
    #: JSON nesting depth (Kineto traces nest < 10 deep; call stacks and shapes a few more)
    max_depth: int = 512

    def __post_init__(self) -> None:
        for name in ("max_decompressed_bytes", "max_events", "max_depth"):
            if getattr(self, name) < 1:
                raise ConfigError(f"limit {name} must be >= 1")


DEFAULT_LIMITS = LoadLimits()


def size_text(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


# The refusals, worded once for every reader (the scanner, the reference decoder, gunzip)
def file_too_large(source: str, size: int, limits: LoadLimits) -> TraceFormatError:
    return TraceFormatError(source, f"file is {size_text(size)}, above the {size_text(limits.max_decompressed_bytes)} limit")


def decompressed_too_large(source: str, limits: LoadLimits) -> TraceFormatError:
    return TraceFormatError(source, f"decompresses to more than the {size_text(limits.max_decompressed_bytes)} limit "
                            "(a gzip bomb, or raise the limit with --max-size)")


def too_many_events(source: str, limits: LoadLimits, count: int | None = None) -> TraceFormatError:
    """``count``: the total, when known (a streaming reader stops as soon as it passes the limit)."""
    if count is None:
        return TraceFormatError(source, f"more than {limits.max_events:,} events, above the limit (max_events)")
    return TraceFormatError(source, f"{count:,} events, above the {limits.max_events:,} limit (max_events)")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)[iI]?[bB]?\s*$")


def parse_size(text: str) -> int:
    """'512M', '8G', '1.5GiB', '1000' -> bytes."""
    m = _SIZE.match(text)
    if not m:
        raise ConfigError(f"not a size: {text!r} (examples: 512M, 8G)")
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)
