"""The compiled columnar scanner agrees with the reference msgspec decoder, on every real trace,
at every chunk boundary, and on every number form; what it does not handle goes to the reference."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinetoscope.analyze.ingest import scan
from kinetoscope.analyze.ingest.build import build_rank_trace
from kinetoscope.analyze.ingest.limits import LoadLimits
from kinetoscope.analyze.ingest.loader import is_trace_file, read_bytes
from kinetoscope.analyze.ingest.parser import parse_bytes
from kinetoscope.analyze.ingest.raw import from_parsed
from kinetoscope.errors import TraceFormatError

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "traces"
_scan = scan._scan


pytestmark = pytest.mark.skipif(_scan is None, reason="the C scanner is not built")


def _paths() -> list[Path]:
    roots = [ROOT / "sample_traces"] + ([SHARED] if SHARED.is_dir() else [])
    return sorted(p for r in roots for p in r.rglob("*") if is_trace_file(p))


def _tables(raw, size, consume=False):
    t = build_rank_trace(raw, source="x", rank=0, rank_source="default", bytes_read=size, consume=consume)
    return t, dataclasses.asdict(t.meta)


def _assert_same(a, b):
    (ta, ma), (tb, mb) = a, b
    for name in ("events", "memory", "counters", "flows", "instants", "steps", "comm_args", "marks", "shapes"):
        pd.testing.assert_frame_equal(getattr(ta, name), getattr(tb, name), check_exact=True)
    assert ma == mb


def _reference(path: Path):
    data = read_bytes(path)
    return from_parsed(parse_bytes(data, str(path))), len(data)


@pytest.mark.slow
@pytest.mark.parametrize("path", _paths(), ids=lambda p: p.name)
def test_scanner_tables_equal_the_reference_on_real_traces(path):
    scanned = scan.scan_file(path)
    assert scanned is not None, "a real Kineto trace should never need the reference decoder"
    assert scanned[0].decoder == "scanner"
    fields = len(scanned[0].f_event)
    # built as the loader builds it: the raw args fields emptied as they are split (the build's peak memory)
    _assert_same(_tables(*scanned, consume=True), _tables(*_reference(path)))
    assert (fields, len(scanned[0].f_event), len(scanned[0].f_value), len(scanned[0].f_id)) == (fields, 0, 0, 0)


def test_tiny_chunks_carry_events_across_boundaries(monkeypatch):
    path = ROOT / "sample_traces" / "real" / "h100_tiny_before_fix_trace.json"
    whole = scan.scan_file(path)
    monkeypatch.setattr(scan, "CHUNK_BYTES", 7)  # every event straddles chunks; the buffer must grow
    _assert_same(_tables(*scan.scan_file(path)), _tables(*whole))


DOC = json.dumps({
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "H100 \u00e9"}],
    "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python \u2603"}},
        {"ph": "X", "cat": "kernel", "name": "k\u00e9rnel \"q\" \\ \U0001F680 RAW", "pid": 0, "tid": "stream 7",
         "ts": 1419104476613.318, "dur": 5.54, "args": {"device": 0, "stream": "0x7", "correlation": 12,
                                                       "bytes": 1.5, "External id": 2 ** 70, "skip": [1, {"a": None}]}},
        {"ph": "C", "name": "mem", "pid": 7, "ts": 12.5, "args": {"allocated": 3, "label": "x", "frac": 0.25}},
        {"ph": "s", "id": "0x10", "pid": 7, "tid": 7, "ts": 1, "cat": "ac2g"},
        {"ph": "i", "name": "[memory]", "pid": 7, "tid": 7, "ts": 2, "s": "t",
         "args": {"Bytes": -64, "Total Allocated": 128, "Device Id": 0, "Device Type": 1, "Addr": 140}},
        {"ph": "Q", "name": "unknown phase", "ts": 3},
    ],
    "distributedInfo": {"rank": 3, "world_size": 8},
}, indent=1).encode().replace(b"RAW", "\u00e9\u2603\U0001F680".encode())  # escapes and raw UTF-8


def test_every_split_point_gives_the_same_columns():
    expect = None
    for cut in range(0, len(DOC) + 1, 3):
        s = _scan.Scanner()
        used = s.feed(DOC[:cut], False)
        assert used >= 0, s.reason
        assert s.feed(DOC[used:], True) >= 0, s.reason
        out = s.finish()
        got = (out["n"], out["ts"], out["f_value"], out["strings"], out["idents"], out["odd"], out["c_value"],
               out["meta"])
        expect = expect or got
        assert got == expect


def test_small_document_matches_the_reference_field_by_field(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(DOC)
    scanned = scan.scan_file(path)
    assert scanned is not None
    _assert_same(_tables(*scanned), _tables(*_reference(path)))
    raw = scanned[0]
    assert raw.metadata["distributedInfo"] == {"rank": 3, "world_size": 8}
    assert sorted(raw.c_value.tolist()) == [0.25, 3.0]


def test_collective_metadata_in_every_form_decodes_like_the_reference(tmp_path):
    """Strings kept as strings, numbers as int64 (a string number coerced like an id), anything else ignored:
    the same by both decoders, and in the right rows after the time sort."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 7, "ts": 50, "dur": 5,
         "args": {"device": 0, "stream": 7, "Collective name": "allreduce", "Process Group Name": "0",
                  "Process Group Ranks": "[0, 1]", "In msg nelems": 1024, "Out msg nelems": 1024, "Group size": 2,
                  "Seq": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
         "args": {"Collective name": "_allgather_base", "Process Group Name": 3, "Process Group Ranks": [0, 1],
                  "In msg nelems": "25136", "Seq": "12", "Group size": 2.0}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 30, "dur": 5, "args": {}},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    scanned = scan.scan_file(path)
    assert scanned is not None
    ours, ref = _tables(*scanned), _tables(*_reference(path))
    _assert_same(ours, ref)
    comm = ours[0].comm_args
    assert comm["row"].tolist() == [0, 2]  # record_param_comms first in time, the kernel last
    assert comm["coll_name"].tolist() == ["_allgather_base", "allreduce"]
    assert comm["pg_name"].isna().tolist() == [True, False] and comm["pg_ranks"].tolist()[1] == "[0, 1]"
    assert comm["in_nelems"].tolist() == [25136, 1024] and comm["seq"].tolist() == [12, 7]
    assert comm["group_size"].tolist() == [2, 2]


@pytest.mark.parametrize("doc, why", [
    (b'{"traceEvents": [{"ph": "X", "ts": "12"}]}', "ts as a string"),
    (b'{"traceEvents": [{"ph": "X", "ts": 1, "pid": 1.5}]}', "float pid"),
    (b'{"traceEvents": [1, {"ph": "X", "ts": 1}]}', "an item that is not an object"),
    (b'{"traceEvents": [{"ph": "X", "ts": 1, "name": "\\ud800"}]}', "lone surrogate"),
    (b'{"traceEvents": [{"ph": "X", "ts": 1, "ts": 2}]}', "repeated key"),
    # the reference accepts these inside values it skips, so they are its call
    (b'{"traceEvents": [{"ph": "X", "ts": 1, "args": {"note": "\xff"}}]}', "invalid UTF-8 in a skipped value"),
    (b'{"traceEvents": [{"ph": "X", "ts": 1e400}]}', "number out of range"),
])
def test_valid_json_the_scanner_does_not_handle_goes_to_the_reference(doc, why):
    with pytest.raises(scan.Unhandled):
        scan.scan_bytes(doc, "t.json")


@pytest.mark.parametrize("doc, phrase", [
    (b'{"traceEvents": [{"ph": "X", "ts": 1, "name": "a\x01"}]}', "control character"),
    (b'{"traceEvents": [{"ph": "X", "ts": 1}]} {}', "two traces concatenated"),
    (b'{"traceEvents": [{"ph": "X", "ts": 1}]', "ends early"),
    (b'{"traceEvents": [{"ph": "X", "ts": 1, "args": {"x": ' + b"[" * 600 + b"]" * 600 + b"}}]}",
     "nested deeper than 512"),
    (b"\0\0\0\0", "not a JSON trace"),
    (b"   ", "file is empty"),
    # the reference decodes names: invalid UTF-8 there, it refuses too
    (b'{"traceEvents": [{"ph": "X", "ts": 1, "name": "\xff"}]}', "invalid UTF-8 in a decoded string"),
    (b'{"nodes": [], "schema": "1.0"}', "execution trace"),
    (b'{"other": 1}', "without 'traceEvents'"),
    (b'{"traceEvents": null}', "'traceEvents' is not a list"),
    (b'{"traceEvents": [], "x": [' + b"0," * (3 * 2**20) + b'0]}', "more than 4 MiB of top-level values"),
    (b'{"traceEvents": [], "x": "' + b"a" * (17 * 2**20) + b'"}', "of more than 16 MiB"),
    (b"[" + b"{}," * (3 * 2**20) + b"{}]", "under 24 bytes each"),
])
def test_what_is_wrong_with_a_document_is_final(doc, phrase):
    """The reference decoder would refuse these too, after holding the whole file: the scanner's word is final."""
    with pytest.raises(TraceFormatError, match=phrase):
        scan.scan_bytes(doc, "t.json")


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.tuples(st.integers(0, 10**17), st.integers(0, 999_999)).map(lambda t: f"{t[0]}.{t[1]:06d}"),
    st.tuples(st.integers(0, 10**6), st.integers(0, 99), st.integers(-30, 30)).map(lambda t: f"{t[0]}.{t[1]}e{t[2]}"),
))
def test_numbers_are_correctly_rounded(text):
    doc = f'[{{"ph": "X", "ts": {text}, "dur": {text}}}]'.encode()
    s = _scan.Scanner()
    assert s.feed(doc, True) >= 0, s.reason
    out = s.finish()
    expect = float(text)
    assert np.frombuffer(out["ts"], dtype=np.float64)[0] == expect
    assert np.frombuffer(out["dur"], dtype=np.float64)[0] == expect


def test_gzip_is_streamed_with_the_size_limit(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(DOC))
    raw, size = scan.scan_file(path)
    assert size == len(DOC) and raw.n == 6
    with pytest.raises(TraceFormatError, match="gzip bomb"):
        scan.scan_file(path, LoadLimits(max_decompressed_bytes=100))
    plain = tmp_path / "t.json"
    plain.write_bytes(DOC)
    with pytest.raises(TraceFormatError, match="above the"):
        scan.scan_file(plain, LoadLimits(max_decompressed_bytes=100))


def test_corrupt_gzip_is_refused_by_the_scanner(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(DOC)[:-30])
    with pytest.raises(TraceFormatError, match="corrupt or truncated gzip"):
        scan.scan_file(path)


def test_gzip_without_isal_gives_the_same_tables(tmp_path, monkeypatch):
    """ISA-L inflates when installed, zlib otherwise: the same columns either way, and the same refusals."""
    sources = [p for p in _paths() if p.name.endswith(".gz")][:4]
    assert sources
    for src in sources:
        fast = scan.scan_file(src)
        with monkeypatch.context() as m:
            m.setattr(scan, "_GzipFile", gzip.GzipFile)
            slow = scan.scan_file(src)
        _assert_same(_tables(*fast), _tables(*slow))
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(DOC)[:-30])
    monkeypatch.setattr(scan, "_GzipFile", gzip.GzipFile)
    with pytest.raises(TraceFormatError, match="corrupt or truncated gzip"):
        scan.scan_file(path)


def test_isal_inflates_gzip_here():
    """The speed figures in BENCHMARKS.md are for ISA-L's inflate: where it is installed (every platform with its
    wheels, this one included), it must be what the scanner uses."""
    IGzipFile = pytest.importorskip("isal.igzip").IGzipFile

    assert scan._GzipFile is IGzipFile


def test_a_scan_started_ahead_hands_over_its_columns_or_its_error(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(DOC)
    ahead = scan.Ahead(path)
    got = ahead.result()
    _assert_same(_tables(*got), _tables(*scan.scan_file(path)))
    assert ahead.result() is None  # handed over once: the columns are not kept by the Ahead
    broken = tmp_path / "b.json"
    broken.write_bytes(DOC[:-40])
    with pytest.raises(TraceFormatError, match="ends early"):
        scan.Ahead(broken).result()


def test_one_malloc_arena_takes_on_glibc():
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    from kinetoscope.cli.process import one_malloc_arena

    assert one_malloc_arena() is True


def test_the_reference_decoder_can_be_forced(monkeypatch, tmp_path):
    from kinetoscope.analyze.ingest.limits import LoadLimits

    path = tmp_path / "t.json"
    path.write_bytes(DOC)
    assert scan.scan_file(path) is not None
    assert scan.scan_file(path, LoadLimits(decoder="reference")) is None
    # the library reads no environment: the variable is the command's (cli.settings), not the scanner's
    monkeypatch.setenv("KINETOSCOPE_DECODER", "reference")
    assert scan.scan_file(path) is not None


def _plain_copies(tmp_path: Path) -> list[Path]:
    sources = [p for p in _paths() if p.stat().st_size > 20_000][:12]
    out = []
    for i, src in enumerate(sources):
        dst = tmp_path / f"{i}-{src.name.removesuffix('.gz')}"
        dst.write_bytes(read_bytes(src))
        out.append(dst)
    return out


@pytest.mark.slow
def test_two_halves_scanned_at_once_equal_the_reference(tmp_path, monkeypatch):
    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0)
    copies = _plain_copies(tmp_path)
    assert copies
    for path in copies:
        _assert_same(_tables(*scan.scan_file(path)), _tables(*_reference(path)))


def test_a_wrong_guess_at_the_middle_falls_back_to_one_pass(tmp_path, monkeypatch):
    """The middle of this file lies inside an args list of objects: '},{' there is no item boundary."""
    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0)
    inner = ",".join(f'{{"k": {i}}}' for i in range(20_000))
    doc = ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": {"list": [' + inner + ']}},'
           ' {"ph": "X", "name": "b", "ts": 5, "dur": 1}], "traceName": "t"}').encode()
    path = tmp_path / "t.json"
    path.write_bytes(doc)
    raw, size = scan.scan_file(path)
    assert raw.n == 2 and size == len(doc) and raw.metadata == {"traceName": "t"}
    _assert_same(_tables(raw, size), _tables(*_reference(path)))


def test_two_halves_of_a_bare_array_trace(tmp_path, monkeypatch):
    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0)
    events = [{"ph": "X", "name": f"op{i % 7}", "pid": 1, "tid": i % 3, "ts": i * 10, "dur": 5,
               "args": {"External id": i}} for i in range(5000)]
    path = tmp_path / "bare.json"
    path.write_bytes(json.dumps(events, indent=2).encode())
    raw, size = scan.scan_file(path)
    assert raw.n == 5000
    _assert_same(_tables(raw, size), _tables(*_reference(path)))


def test_the_json_is_never_held_in_memory(tmp_path):
    """A 40 MB trace of 2,000 events with bulky args: the scan's Python-visible peak stays near one
    chunk, far below the file (memory follows the events kept, not the bytes read)."""
    import tracemalloc

    bulky = {"Concrete Inputs": ["x" * 200] * 100}
    events = [{"ph": "X", "name": f"op{i % 5}", "pid": 1, "tid": 1, "ts": i, "dur": 1, "args": bulky}
              for i in range(2000)]
    path = tmp_path / "bulky.json"
    path.write_bytes(json.dumps({"traceEvents": events}).encode())
    size = path.stat().st_size
    assert size > 40_000_000
    tracemalloc.start()
    try:
        raw, _ = scan.scan_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert raw.n == 2000
    assert peak < 3 * scan.CHUNK_BYTES < size / 1.5


@pytest.mark.slow
def test_mutated_documents_the_scanner_accepts_decode_like_the_reference(tmp_path):
    """Differential fuzzing: random byte edits of a real trace. Whatever the scanner accepts must give the
    reference decoder's tables; whatever it refuses as final, the reference must refuse too; the rest goes
    to the reference."""
    import random

    from kinetoscope.errors import KinetoscopeError

    source = (ROOT / "sample_traces" / "real" / "h100_tiny_before_fix_trace.json").read_bytes()
    tokens = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"\\u00e9", b"\\ud800", b"1e999", b"-",
              b"\xff", b"\xc3\xa9", b"null", b"true", b'"ph"', b'"args"', b'"C"', b"0.5", b"123456789012345678901",
              b"\x01", b"01", b"1.", b"tru", b"NaN", b"\\x"]
    rnd = random.Random(7)
    accepted = refused = 0
    for case in range(1500):
        d = bytearray(source)
        for _ in range(rnd.randint(1, 3)):
            i = rnd.randrange(len(d))
            op = rnd.random()
            if op < 0.4:
                d[i:i] = rnd.choice(tokens)
            elif op < 0.7:
                del d[i:i + rnd.randint(1, 8)]
            else:
                d[i] = rnd.randrange(32, 127)
        path = tmp_path / f"m{case}.json"
        path.write_bytes(bytes(d))
        try:
            scanned = scan.scan_bytes(bytes(d), path.name)
        except scan.Unhandled:
            continue
        except TraceFormatError:
            refused += 1
            with pytest.raises(KinetoscopeError):  # a final verdict the reference would not reach is a scanner bug
                _reference(path)
            continue
        accepted += 1
        try:
            reference = _reference(path)
        except KinetoscopeError as exc:  # pragma: no cover - would be a scanner bug
            raise AssertionError(f"case {case}: the scanner accepted what the reference rejects: {exc}") from None
        try:
            _assert_same(_tables(*scanned), _tables(*reference))
        except KinetoscopeError:
            pass  # both produce no timed events: the same refusal either way
    assert accepted > 200 and refused > 200, (accepted, refused)


def test_the_event_limit_holds_across_both_halves(tmp_path, monkeypatch):
    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0)
    events = [{"ph": "X", "name": "op", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(3000)]
    path = tmp_path / "t.json"
    path.write_bytes(json.dumps({"traceEvents": events}, indent=1).encode())
    assert scan.scan_file(path, LoadLimits(max_events=3000))[0].n == 3000
    with pytest.raises(TraceFormatError, match="max_events"):
        scan.scan_file(path, LoadLimits(max_events=2000))  # each half alone stays under it


def test_a_repeated_trace_events_key_counts_as_a_json_decoder_reads_it():
    """Repeated keys: the last one counts, as for the reference decoder (a null first, then the list)."""
    doc = b'{"traceEvents": null, "traceEvents": [{"ph": "X", "ts": 1, "dur": 2, "name": "a", "pid": 1, "tid": 1}]}'
    raw, _ = scan.scan_bytes(doc, "t.json")
    assert raw.n == 1


def _marked_trace(n: int) -> list[dict]:
    """Ops with a loop mark (category kinetoscope) every fifth event, args of every type a mark carries; one mark
    of another case (not a mark's category: its args are not read) and one whose args is an odd value."""
    events = []
    for i in range(n):
        events.append({"ph": "X", "cat": "cpu_op", "name": f"op{i % 7}", "pid": 1, "tid": 1, "ts": i * 10, "dur": 5,
                       "args": {"External id": i}})
        if i % 5 == 0:
            events.append({"ph": "X", "cat": "kinetoscope", "name": "kinetoscope::data_wait", "pid": 1, "tid": 1,
                           "ts": i * 10 + 1, "dur": 2, "args": {"loader": i % 3, "role": ["train", "eval"][i % 2],
                                                                 "batch": i, "exhausted": i % 10 == 0, "x": None,
                                                                 "nested": {"a": [1, 2.5, "z"]}}})
    events.append({"ph": "X", "cat": "Kinetoscope", "name": "kinetoscope::backward", "pid": 1, "tid": 1, "ts": 3,
                   "dur": 1, "args": {"micro_step": 1}})
    events.append({"ph": "X", "cat": "kinetoscope", "name": "kinetoscope::compile", "pid": 1, "tid": 1, "ts": 4,
                   "dur": 1, "args": {"compile_id": 7, "recompile": "yes", "micro_step": True, "batch": 2**70}})
    return events


def _scan_in_small_chunks_and_in_halves(path, monkeypatch):
    """The file scanned in 4 KiB chunks, then again as two halves merged (asserting they were), and the reference
    decoder's tables."""
    monkeypatch.setattr(scan, "CHUNK_BYTES", 4096)
    one = scan.scan_file(path)
    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0)
    merged = []
    monkeypatch.setattr(scan, "_merge", lambda a, b, merge=scan._merge: merged.append(1) or merge(a, b))
    halves = scan.scan_file(path)
    assert merged  # the two halves were merged
    return one, halves, _tables(*_reference(path))


def test_loop_marks_decode_like_the_reference_across_chunks_and_halves(tmp_path, monkeypatch):
    path = tmp_path / "marked.json"
    path.write_bytes(json.dumps({"traceEvents": _marked_trace(4000)}, indent=1).encode())
    one, halves, reference = _scan_in_small_chunks_and_in_halves(path, monkeypatch)
    for scanned in (one, halves):
        assert scanned[0].decoder == "scanner" and len(scanned[0].marks) == 801
        _assert_same(_tables(*scanned), reference)
    marks = reference[0].marks
    # 800 data waits and the compile mark (kind "mark"), and the mark of another case: its category normalises to
    # "kinetoscope" (kind "mark"), its args are not read: <NA>
    assert len(marks) == 802 and marks["name"].value_counts().to_dict() == {
        "kinetoscope::data_wait": 800, "kinetoscope::backward": 1, "kinetoscope::compile": 1}
    waits = marks[marks["name"] == "kinetoscope::data_wait"]
    assert waits["batch"].tolist() == list(range(0, 4000, 5)) and waits["exhausted"].sum() == 400
    odd = marks[marks["name"] != "kinetoscope::data_wait"]
    # values not of their column's type are <NA>, never coerced (7 is no compile id, "yes" no bool, True no int)
    assert odd[["micro_step", "compile_id", "recompile", "batch"]].isna().all().all()


def _shaped_trace(n: int) -> list[dict]:
    """``n`` ops recorded with shapes (one in four without Concrete Inputs), out of time order, with events in other
    categories that carry the same key (never kept) and an op whose args are not an object."""
    events: list[dict] = []
    for i in range(n):
        args: dict = {"Input Dims": [[i % 7 + 1, 64], [64, 32]], "Input type": ["float", "c10::BFloat16"]}
        if i % 4:
            args["Concrete Inputs"] = ["", str(i % 3)]
        events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::mm{i % 2}", "pid": 1, "tid": 1,
                       "ts": (n - i) * 3, "dur": 2, "args": args})
    events.append({"ph": "X", "cat": "user_annotation", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
                   "args": {"Input Dims": [[1]]}})
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 2, "dur": 1,
                   "args": {"Input type": ["float"]}})
    events.append({"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5, "dur": 1,
                   "args": {"Input Dims": [[2, 2], [2, 2]]}})
    return events


def test_op_shapes_decode_like_the_reference_across_chunks_and_halves(tmp_path, monkeypatch):
    path = tmp_path / "shaped.json"
    path.write_bytes(json.dumps({"traceEvents": _shaped_trace(3000)}, indent=1).encode())
    one, halves, reference = _scan_in_small_chunks_and_in_halves(path, monkeypatch)
    for scanned in (one, halves):
        assert scanned[0].decoder == "scanner" and len(scanned[0].shapes) == 3001
        _assert_same(_tables(*scanned), reference)
    trace = reference[0]
    shapes = trace.shapes
    # 3000 aten::mm ops and the Operator-category add; not the annotation, not the op without Input Dims
    assert len(shapes) == 3001 and shapes["row"].is_monotonic_increasing
    names = trace.events["name"].astype(str).to_numpy()[shapes["row"].to_numpy()]
    assert sorted(set(names)) == ["aten::add", "aten::mm0", "aten::mm1"]
    assert int(shapes["concrete_inputs"].isna().sum()) == 750 + 1  # i % 4 == 0, and the add
    first = shapes.iloc[0]  # the earliest op: the last mm, at 3 us
    assert trace.events["ts_ns"].iloc[int(first["row"])] == 3000
    assert json.loads(first["input_dims"]) == [[2999 % 7 + 1, 64], [64, 32]]
