"""A corpus of hostile and broken trace files, and what a user must see for each.

``write_corpus(folder)`` writes the files and returns {file name: Expect}. An Expect says whether
the file must be refused with one clear error (``error`` = a phrase of the message) or analysed
with a note about what was skipped (``note`` = a phrase of a loader warning).
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

GOOD = {"schemaVersion": 1, "traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 100},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 20, "dur": 5,
     "args": {"correlation": 7}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 30, "dur": 500,
     "args": {"device": 0, "stream": 7, "correlation": 7}},
]}

#: the limit the corpus is run with, small so the gzip bomb is caught quickly
MAX_SIZE = "64M"
BOMB_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Expect:
    error: str | None = None
    note: str | None = None


def _good_bytes() -> bytes:
    return json.dumps(GOOD).encode()


def _bomb() -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [comp.compress(b'{"traceEvents": [')]
    block = b" " * 2**20
    for _ in range(BOMB_BYTES // len(block)):
        parts.append(comp.compress(block))
    parts.append(comp.compress(b"]}"))
    parts.append(comp.flush())
    return b"".join(parts)


def write_corpus(folder: Path) -> dict[str, Expect]:
    folder.mkdir(parents=True, exist_ok=True)
    good = _good_bytes()
    wrong_types = {"traceEvents": GOOD["traceEvents"] + [
        {"ph": "X", "name": "strings", "pid": 1, "tid": 1, "ts": "200", "dur": "50"},
        {"ph": "X", "name": "negative", "pid": 1, "tid": 1, "ts": 300, "dur": -5},
        {"ph": "X", "name": "no time", "pid": 1, "tid": 1},
        "not an event", 42, None,
    ]}
    cases: dict[str, tuple[bytes, Expect]] = {
        "empty.json": (b"", Expect(error="file is empty")),
        "whitespace.json": (b"  \n\t ", Expect(error="file is empty")),
        "not_json.json": (b"hello, world", Expect(error="not a JSON trace")),
        "random_bytes.json.gz": (bytes(range(256)) * 8, Expect(error="not a JSON trace")),
        "gzip_header_garbage.json.gz": (b"\x1f\x8b\x08\x00" + b"garbage" * 20, Expect(error="gzip")),
        "truncated.json": (good[: len(good) // 2], Expect(error="ends early")),
        "truncated.json.gz": (gzip.compress(good)[:-12], Expect(error="gzip")),
        "hello_world.json": (b'{"hello": "world"}', Expect(error="without 'traceEvents'")),
        "trace_events_not_a_list.json": (b'{"traceEvents": {"a": 1}}', Expect(error="not a list")),
        "execution_trace.json": (json.dumps({
            "schema": "1.1.0-chakra.0.0.4", "pid": 1, "time": "t",
            "nodes": [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]"}]}).encode(),
                                 Expect(error="execution trace")),
        "memory_timeline.json": (b"[[1000, 2000, 3000], [[0, 1024], [2048, 4096]]]", Expect(error="not trace events")),
        "rocprof_stats.json": (b"Name,Calls,TotalDurationNs\nhipLaunchKernel,10,1234\n",
                               Expect(error="not a JSON trace")),
        "wrong_types.json": (json.dumps(wrong_types).encode(), Expect(note="were not JSON objects")),
        "nan.json": (good.replace(b'"ts": 10,', b'"ts": NaN,'), Expect(error="not valid JSON")),
        "huge_number.json": (good.replace(b'"ts": 10,', b'"ts": 1e400,'), Expect(error="not valid JSON")),
        "int_beyond_int64.json": (good.replace(b'"correlation": 7}}, {"ph": "X", "cat": "kernel"',
                                               b'"correlation": 1180591620717411303424}}, {"ph": "X", "cat": "kernel"'),
                                  Expect()),
        "invalid_utf8.json": (good.replace(b'"aten::mm"', b'"aten::\xff\xfemm"'), Expect(error="UTF-8")),
        "control_characters.json": (good.replace(b'"aten::mm"', b'"aten::\\u0001\\u0007mm\\u001b[31m"'), Expect()),
        "deep_nesting.json": (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"x": '
                              + b"[" * 50_000 + b"]" * 50_000 + b"}}]}", Expect(error="nested deeper")),
        "gzip_bomb.json.gz": (_bomb(), Expect(error="gzip bomb")),
        "two_traces_concatenated.json": (good + good, Expect(error="concatenated")),
        "byte_order_mark.json": (b"\xef\xbb\xbf" + good, Expect()),
        "good.json": (good, Expect()),
    }
    for name, (data, _) in cases.items():
        (folder / name).write_bytes(data)
    return {name: expect for name, (_, expect) in cases.items()}


def write_amplifiers(folder: Path) -> dict[str, Expect]:
    """Files small on disk or easy to write whose naive analysis costs memory or time many times their size
    (found by the issue-16 review): repeated valid events gzipped 200-fold, tiny events, huge metadata, one
    huge value, a large file cut short, invalid UTF-8 at the end of a large file."""
    folder.mkdir(parents=True, exist_ok=True)
    events = json.dumps(GOOD["traceEvents"])[1:-1].encode()
    block = b", ".join([events] * 2000) + b", "
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with open(folder / "repeated_events.json.gz", "wb") as fh:  # 256 MiB of valid events in ~1.3 MB
        fh.write(comp.compress(b'{"traceEvents": ['))
        for _ in range(256 * 2**20 // len(block)):
            fh.write(comp.compress(block))
        fh.write(comp.compress(events + b"]}") + comp.flush())
    (folder / "tiny_events.json").write_bytes(b"[" + b"{}," * (20 * 2**20) + b"{}]")
    (folder / "huge_metadata.json").write_bytes(b'{"traceEvents": [' + events + b'], "x": ['
                                                + b"[]," * (5 * 2**20) + b"[]]}")
    (folder / "one_huge_value.json").write_bytes(b'{"traceEvents": [' + events + b'], "x": "' + b"a" * (40 * 2**20)
                                                 + b'"}')
    with open(folder / "large_truncated.json", "wb") as fh:
        fh.write(b'{"traceEvents": [')
        for _ in range(200 * 2**20 // len(block)):
            fh.write(block)
        fh.write(b'{"ph": "X", "na')
    with open(folder / "large_bad_utf8_at_end.json", "wb") as fh:
        fh.write(b'{"traceEvents": [')
        for _ in range(100 * 2**20 // len(block)):
            fh.write(block)
        fh.write(b'{"ph": "X", "name": "bad\xff", "pid": 1, "tid": 1, "ts": 5, "dur": 1}]}')
    return {
        "repeated_events.json.gz": Expect(error="gzip bomb"),
        "tiny_events.json": Expect(error="under 24 bytes each"),
        "huge_metadata.json": Expect(error="top-level values"),
        "one_huge_value.json": Expect(error="more than 16 MiB"),
        "large_truncated.json": Expect(error="ends early"),
        "large_bad_utf8_at_end.json": Expect(error="invalid UTF-8"),
    }
