"""Limits that keep a hostile or broken trace from taking unbounded time or memory."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kinetoscope.errors import ConfigError, TraceFormatError

#: both decoders descend one native stack frame per nesting level, and the reference decoder's depth is
#: bounded by Python's own recursion limit (1000 by default, never changed here): stay well below it
MAX_DEPTH_CEILING = 900


@dataclass(frozen=True)
class LoadLimits:
    #: gunzipped size; guards against gzip bombs (a 5-step 7B-model trace is ~4 GB)
    max_decompressed_bytes: int = 8 * 2**30
    #: trace events in one file (a 4 GB trace holds ~20 M)
    max_events: int = 200_000_000
    #: JSON nesting depth (Kineto traces nest < 10 deep; call stacks and shapes a few more)
    max_depth: int = 512
    #: a file the fast scanner leaves to the reference decoder (valid JSON it does not handle exactly) is
    #: held whole in memory by that decoder: only up to this gunzipped size
    max_fallback_bytes: int = 16 * 2**20
    #: which decoder reads a file: "native" (the compiled scanner where built, the reference decoder for what it
    #: leaves) or "reference" (the reference decoder for everything; the command's ``KINETOSCOPE_DECODER``)
    decoder: str = "native"

    def __post_init__(self) -> None:
        if self.decoder not in ("native", "reference"):
            raise ConfigError(f"decoder {self.decoder!r}: expected 'native' or 'reference'")
        for name in ("max_decompressed_bytes", "max_events", "max_depth", "max_fallback_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"limit {name} must be >= 1")
        if self.max_depth > MAX_DEPTH_CEILING:
            raise ConfigError(f"limit max_depth must be <= {MAX_DEPTH_CEILING} (both decoders recurse per level; "
                              "deeper nesting would exhaust the stack)")


DEFAULT_LIMITS = LoadLimits()


def size_text(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


# The refusals, worded once for every reader (the scanner, the reference decoder, gunzip)
def file_too_large(source: str, size: int, limits: LoadLimits) -> TraceFormatError:
    return TraceFormatError(
        source, f"file is {size_text(size)}, above the {size_text(limits.max_decompressed_bytes)} limit"
    )


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


def fallback_too_large(source: str, reason: str, limits: LoadLimits) -> TraceFormatError:
    return TraceFormatError(source, f"holds JSON the fast scanner does not handle ({reason}) and is larger than the "
                            f"{size_text(limits.max_fallback_bytes)} the reference decoder may hold in memory "
                            "(about 12 times the file); raise that limit (kinetoscope analyze --max-fallback, or "
                            "KINETOSCOPE_MAX_FALLBACK for the app) to try it anyway")


#: a Kineto trace gzips 10-30 fold (repeated names and keys: 30x for the most repetitive of the real traces
#: in ../shared/traces); deflate's ceiling is ~1030. Past this ratio, measured once the output passes
#: GZIP_RATIO_AFTER_BYTES, a file is a gzip bomb (or events repeated by a generator), whatever --max-size says
MAX_GZIP_RATIO = 100
GZIP_RATIO_AFTER_BYTES = 64 * 2**20


def inflates_too_much(source: str, out_bytes: int, in_bytes: int) -> TraceFormatError | None:
    """The refusal for a gzip stream inflating more than MAX_GZIP_RATIO-fold, or None."""
    if out_bytes > GZIP_RATIO_AFTER_BYTES and out_bytes > MAX_GZIP_RATIO * max(in_bytes, 1):
        return TraceFormatError(
            source,
            f"a gzip bomb: {size_text(in_bytes)} inflate to more than {size_text(out_bytes)} "
            f"({out_bytes // max(in_bytes, 1):,}-fold; a trace compresses 10-30-fold)",
        )
    return None


#: why a PyTorch execution trace (``{"schema": ..., "nodes": [...]}``) is refused
EXECUTION_TRACE = ("a PyTorch execution trace (ExecutionTraceObserver), not a Kineto trace: capture with "
                   "torch.profiler instead")
