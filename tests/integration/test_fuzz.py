"""Property-based: mutate real traces (truncate, flip bytes, drop fields, change types) and demand
a report or a typed error, nothing else."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kinetoscope.analyze.ingest.limits import LoadLimits
from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.report.builder import build_report
from kinetoscope.errors import KinetoscopeError

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "sample_traces" / "real"
SOURCES = {
    "amd": gzip.decompress((REAL / "mi250_minitoy_train_ROCm6_2_kineto.json.gz").read_bytes()),
    "h100": (REAL / "h100_tiny_before_fix_trace.json").read_bytes(),
}
DOCS = {k: json.loads(v) for k, v in SOURCES.items()}
LIMITS = LoadLimits(max_decompressed_bytes=32 * 2**20)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def outcome(tmp_path: Path, data: bytes, name: str = "t.json") -> None:
    path = tmp_path / name
    path.write_bytes(data)
    try:
        report = build_report(load_trace(path, LIMITS))
    except KinetoscopeError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert report.failures == (), report.failures
    for r in report.ranks:
        assert r["window_us"] is not None


@SETTINGS
@given(source=st.sampled_from(sorted(SOURCES)), cut=st.floats(0, 1))
def test_truncated(tmp_path, source, cut):
    data = SOURCES[source]
    outcome(tmp_path, data[: int(len(data) * cut)])


@SETTINGS
@given(source=st.sampled_from(sorted(SOURCES)),
       flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=8), gz=st.booleans())
# found in CI: a byte 0x80 inside an op's "Input type" (kept raw, not checked as UTF-8) was an internal error
@example(source="amd", flips=[(0.16986813551566285, 128)], gz=False)
def test_flipped_bytes(tmp_path, source, flips, gz):
    data = bytearray(gzip.compress(SOURCES[source]) if gz else SOURCES[source])
    for where, value in flips:
        data[min(int(where * len(data)), len(data) - 1)] = value
    outcome(tmp_path, bytes(data), "t.json.gz" if gz else "t.json")


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                   st.text(max_size=8), st.lists(st.integers(), max_size=3),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
FIELDS = ("ph", "name", "cat", "ts", "dur", "pid", "tid", "id", "args")
ARGS = ("correlation", "device", "stream", "External id", "bytes", "Bytes", "Total Allocated", "Device Type",
        "Device Id")


@pytest.mark.slow
@SETTINGS
@given(source=st.sampled_from(sorted(DOCS)), data=st.data())
def test_dropped_and_retyped_fields(tmp_path, source, data):
    doc = json.loads(json.dumps(DOCS[source]))
    events = doc["traceEvents"]
    for _ in range(data.draw(st.integers(1, 12))):
        event = events[data.draw(st.integers(0, len(events) - 1))]
        if not isinstance(event, dict):
            continue
        action = data.draw(st.sampled_from(["drop", "retype", "retype_arg", "replace"]))
        if action == "drop":
            event.pop(data.draw(st.sampled_from(FIELDS)), None)
        elif action == "retype":
            event[data.draw(st.sampled_from(FIELDS))] = data.draw(VALUES)
        elif action == "retype_arg" and isinstance(event.get("args"), dict):
            event["args"][data.draw(st.sampled_from(ARGS))] = data.draw(VALUES)
        else:
            events[events.index(event)] = data.draw(VALUES)
    outcome(tmp_path, json.dumps(doc).encode())
