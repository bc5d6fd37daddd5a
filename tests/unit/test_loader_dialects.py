"""Each Kineto dialect quirk, built in code, loads into the declared columns."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
from conftest import load_built
from tracebuilder import TraceBuilder

from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.model import schema
from kinetoscope.errors import TraceFormatError, TraceSourceError


def _one(trace):
    assert len(trace.ranks) == 1
    return trace.ranks[0]


def test_columns_match_the_schema(tmp_path):
    b = TraceBuilder().step(1, 0, 100).kernel(10, 20, launch_at=5).memory(50, 64, allocated=64, reserved=128)
    r = _one(load_built(tmp_path, b))
    schema.check_frame(r.events, schema.EVENT_COLUMNS, "events")
    schema.check_frame(r.memory, schema.MEMORY_COLUMNS, "memory")
    schema.check_frame(r.counters, schema.COUNTER_COLUMNS, "counters")


def test_trace_events_object_and_bare_array_load_the_same(tmp_path):
    b = TraceBuilder().step(1, 0, 100).kernel(10, 20)
    obj = _one(load_built(tmp_path, b, "obj.json"))
    arr = _one(load_built(tmp_path, b, "arr.json", bare_array=True))
    pd.testing.assert_frame_equal(obj.events, arr.events)
    assert arr.meta.schema_version is None and obj.meta.schema_version == 1


def test_capitalised_2021_categories_are_normalised(tmp_path):
    b = TraceBuilder(metadata=False)
    for cat, ts in (("Operator", 0), ("Runtime", 10), ("Kernel", 20), ("Memcpy", 30), ("Memset", 40)):
        b.raw({"ph": "X", "cat": cat, "name": cat.lower(), "pid": 0 if cat in ("Kernel", "Memcpy", "Memset") else 5,
               "tid": "stream 7" if cat in ("Kernel", "Memcpy", "Memset") else "4093687616", "ts": ts, "dur": 5,
               "args": {"device": 0, "stream": 7, "correlation": 1, "external id": 9}})
    r = _one(load_built(tmp_path, b))
    assert list(r.events["cat"].astype(str)) == ["cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"]
    assert list(r.events["kind"].astype(str)) == ["cpu_op", "runtime", "kernel", "memcpy", "memset"]
    assert r.events["external_id"].tolist() == [9] * 5  # lower-case legacy "external id"


def test_legacy_stream_from_tid_text_when_args_lack_it(tmp_path):
    b = TraceBuilder(metadata=False).raw(
        {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 13", "ts": 1, "dur": 2, "args": {}})
    r = _one(load_built(tmp_path, b))
    assert r.events["stream"].tolist() == [13] and r.events["device"].tolist() == [0]


def test_float_timestamps_keep_nanosecond_precision(tmp_path):
    b = TraceBuilder().op("a", 4203669604595.407, 340.024).op("b", 1695835542514261, 104)
    r = _one(load_built(tmp_path, b))
    ev = r.events.set_index(r.events["name"].astype(str))
    assert ev.loc["a", "ts_ns"] == 4203669604595407
    assert ev.loc["a", "dur_ns"] == 340024
    assert ev.loc["a", "end_ns"] == 4203669604935431
    assert ev.loc["b", "ts_ns"] == 1695835542514261000  # epoch-scale integer us stays exact
    assert (r.events["dur_ns"] >= 0).all()


def test_string_process_ids_and_hip_string_args(tmp_path):
    b = TraceBuilder().raw({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                            "tid": "PyTorch Profiler", "ts": 0, "dur": 100})
    b.raw({"ph": "X", "cat": "cuda_runtime", "name": "hipMemcpyWithStream", "pid": 5, "tid": 5, "ts": 1, "dur": 2,
           "args": {"stream": "0x0", "correlation": 117, "size": "2560", "bytes": "128"}})
    r = _one(load_built(tmp_path, b))
    assert "Spans" in set(r.events["pid"].astype(str))
    hip = r.events[r.events["name"] == "hipMemcpyWithStream"].iloc[0]
    assert hip["correlation"] == 117 and hip["bytes"] == 128
    assert r.meta.warnings == ()  # numbers-as-strings are part of the dialect, not an oddity


def test_rank_from_distributed_info_then_file_name_then_zero(tmp_path):
    assert _one(load_built(tmp_path, TraceBuilder(rank=3, world_size=8).step(1, 0, 10))).rank == 3
    named = _one(load_built(tmp_path, TraceBuilder().step(1, 0, 10), "job.rank_5.trace.json"))
    assert (named.rank, named.meta.rank_source) == (5, "filename")
    plain = _one(load_built(tmp_path, TraceBuilder().step(1, 0, 10), "worker0.json"))
    assert (plain.rank, plain.meta.rank_source) == (0, "default")


def test_directory_of_ranks_loads_each_rank(tmp_path):
    for r in (1, 0):
        TraceBuilder().step(1, 0, 10).write(tmp_path / "job" / f"rank-{r}.json.gz")
    trace = load_trace(tmp_path / "job")
    assert [r.rank for r in trace.ranks] == [0, 1]


def test_two_files_of_one_job_never_collapse_onto_one_rank(tmp_path):
    TraceBuilder(rank=0).step(1, 0, 10).write(tmp_path / "job" / "a.json")
    TraceBuilder(rank=0).step(1, 0, 10).write(tmp_path / "job" / "b.json")
    with pytest.raises(TraceSourceError, match="both claim rank 0"):
        load_trace(tmp_path / "job")


def test_files_without_any_rank_information_get_distinct_ranks(tmp_path):
    TraceBuilder().step(1, 0, 10).write(tmp_path / "job" / "a.json")
    TraceBuilder().step(1, 0, 10).write(tmp_path / "job" / "b.json")
    assert [r.rank for r in load_trace(tmp_path / "job").ranks] == [0, 1]


def test_trace_without_metadata_events_loads(tmp_path):
    r = _one(load_built(tmp_path, TraceBuilder(metadata=False).step(1, 0, 10).kernel(1, 2)))
    assert r.meta.thread_names == {} and len(r.steps) == 1


def test_thread_and_process_names_come_from_metadata_events(tmp_path):
    r = _one(load_built(tmp_path, TraceBuilder().step(1, 0, 10)))
    assert r.meta.process_names == {"100": "python"}
    assert r.meta.thread_names == {("100", "100"): "main"}


def test_kernel_only_trace(tmp_path):
    r = _one(load_built(tmp_path, TraceBuilder(metadata=False).kernel(0, 10).kernel(20, 10)))
    assert r.has_gpu and r.steps.empty and len(r.events) == 2


def test_cpu_only_trace(tmp_path):
    r = _one(load_built(tmp_path, TraceBuilder().step(1, 0, 100).op("aten::mm", 10, 20)))
    assert not r.has_gpu and r.events["device"].isna().all()


def test_memory_events_are_kept(tmp_path):
    b = TraceBuilder().memory(5, 1024, allocated=1024, reserved=2048).memory(6, -1024, allocated=0, reserved=2048)
    b.step(1, 0, 10)
    r = _one(load_built(tmp_path, b))
    assert r.memory["bytes"].tolist() == [1024, -1024]
    assert r.memory["total_allocated_bytes"].tolist() == [1024, 0]
    assert r.memory["device_type"].tolist() == [1, 1]


def test_legacy_memory_events_with_only_bytes(tmp_path):
    b = TraceBuilder().step(1, 0, 10).memory(5, 4, allocated=None, device_type=0, device_id=-1)
    r = _one(load_built(tmp_path, b))
    assert r.memory["total_allocated_bytes"].isna().all() and r.memory["bytes"].tolist() == [4]


def test_flows_are_kept_and_correlation_read_from_args(tmp_path):
    b = TraceBuilder().kernel(10, 5, launch_at=1)
    b.raw({"ph": "s", "id": 1001, "pid": 100, "tid": 100, "ts": 1, "cat": "ac2g", "name": "ac2g"})
    b.raw({"ph": "f", "id": 1001, "pid": 0, "tid": 7, "ts": 10, "cat": "ac2g", "name": "ac2g", "bp": "e"})
    r = _one(load_built(tmp_path, b))
    assert r.flows["id"].tolist() == [1001, 1001] and list(r.flows["phase"].astype(str)) == ["s", "f"]
    assert sorted(r.events["correlation"].dropna().tolist()) == [1001, 1001]


def test_counter_events_become_long_rows(tmp_path):
    b = TraceBuilder().step(1, 0, 10)
    b.raw({"ph": "C", "name": "gpu0", "pid": 0, "ts": 2.5, "args": {"util_pct": 87, "power_w": 301.5}})
    r = _one(load_built(tmp_path, b))
    counters = sorted(zip(r.counters["series"].astype(str), r.counters["value"], strict=True))
    assert counters == [("power_w", 301.5), ("util_pct", 87.0)]
    assert r.counters["ts_ns"].tolist() == [2500, 2500]


def test_unknown_phases_are_counted_not_silently_dropped(tmp_path):
    b = TraceBuilder().step(1, 0, 10).raw({"ph": "B", "name": "x", "pid": 1, "tid": 1, "ts": 1})
    r = _one(load_built(tmp_path, b))
    assert r.meta.unhandled_events == {"ph=B": 1}
    assert any("ph=B: 1" in w for w in r.meta.warnings)


def test_odd_field_types_fall_back_to_lenient_decoding(tmp_path):
    b = TraceBuilder().step(1, 0, 10).raw({"ph": "X", "cat": "cpu_op", "name": "odd", "pid": 1, "tid": 1,
                                           "ts": "5.5", "dur": 1})
    r = _one(load_built(tmp_path, b))
    assert r.events.set_index("name").loc["odd", "ts_ns"] == 5500
    assert any("leniently" in w for w in r.meta.warnings)


def test_gzip_detected_by_content_not_name(tmp_path):
    path = tmp_path / "trace.json"
    path.write_bytes(gzip.compress(json.dumps(TraceBuilder().step(1, 0, 10).document()).encode()))
    assert len(load_trace(path).ranks[0].steps) == 1


def test_profiler_steps_on_the_host_only(tmp_path):
    b = TraceBuilder().step(3, 0, 10).step(4, 10, 10)
    b.raw({"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#3", "pid": 0, "tid": 7, "ts": 2, "dur": 30,
           "args": {"device": 0, "stream": 7}})
    steps = load_built(tmp_path, b).ranks[0].steps
    assert steps["step"].tolist() == [3, 4] and steps["dur_ns"].tolist() == [10_000, 10_000]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty"),
        (b"   ", "empty"),
        (b"{not json", "not valid JSON"),
        (b'{"foo": 1}', "without 'traceEvents'"),
        (b"hello", "not a JSON trace"),
        (b'{"traceEvents": []}', "no timed events"),
        (b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}}]}', "no timed events"),
        (b'{"traceEvents": 5}', "not a list"),
        (gzip.compress(b'{"traceEvents": [')[:-6], "gzip"),
    ],
)
def test_bad_files_raise_one_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message):
        load_trace(path)


def test_missing_path_and_empty_directory(tmp_path):
    with pytest.raises(TraceSourceError, match="no such file"):
        load_trace(tmp_path / "nope.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceSourceError, match="no .json"):
        load_trace(tmp_path / "empty")
