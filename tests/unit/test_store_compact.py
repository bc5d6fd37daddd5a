"""The batch store's compaction: many single files into one part per table, nothing lost, a key's newest rows win."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
from tracebuilder import TraceBuilder  # noqa: E402

from kinetoscope.batch.compact import compact  # noqa: E402
from kinetoscope.batch.store import SCHEMAS, open_store, read_rows, read_table, write_rows  # noqa: E402
from kinetoscope.batch.task import analyze_file  # noqa: E402


def _trace_row(key: str, path: str, mean_step_us: float) -> dict:
    return {"key": key, "job": "job", "path": path, "rank": 0, "status": "ok", "mean_step_us": mean_step_us}


def _finding(key: str, fid: str) -> dict:
    return {"key": key, "job": "job", "path": f"/t/{key}.json", "rank": 0, "id": fid, "severity": "warning",
            "title": fid}


def _fill(root: Path, n: int) -> None:
    for i in range(n):
        key = f"k{i:03d}"
        write_rows(root, "traces", key, [_trace_row(key, f"/t/{key}.json", 1000.0 + i)])
        write_rows(root, "findings", key, [_finding(key, "gpu_idle"), _finding(key, "loader_stall")] if i % 2 else [])


def _files(root: Path, table: str) -> list[str]:
    return sorted(p.name for p in (root / table).glob("*.parquet"))


def _later() -> None:
    """Let the clock move on, so a file written next is newer by its modification time."""
    time.sleep(0.02)


def test_compaction_merges_every_single_file_into_one_part_and_loses_no_row(tmp_path):
    root = open_store(tmp_path / "store", create=True)
    _fill(root, 40)
    merged = compact(root, SCHEMAS)
    assert merged == {"traces": 40, "findings": 40}
    for table in ("traces", "findings"):
        (only,) = _files(root, table)
        assert only.startswith("part-")
    traces = read_table(root, "traces").sort_values("key")
    assert list(traces["key"]) == [f"k{i:03d}" for i in range(40)]
    assert list(traces["mean_step_us"]) == [1000.0 + i for i in range(40)]
    assert len(read_table(root, "findings")) == 40  # 20 odd keys x 2 findings; the even keys' files were empty
    duckdb = pytest.importorskip("duckdb")
    rows = duckdb.sql(f"SELECT count(*), sum(mean_step_us) FROM read_parquet('{root}/traces/*.parquet')").fetchall()
    assert rows == [(40, sum(1000.0 + i for i in range(40)))]
    found = duckdb.sql(f"SELECT id, count(*) FROM read_parquet('{root}/findings/*.parquet') GROUP BY id "
                       "ORDER BY id").fetchall()
    assert found == [("gpu_idle", 20), ("loader_stall", 20)]


def test_a_key_rewritten_after_compaction_reads_as_its_new_rows_then_compacts_over_the_old(tmp_path):
    root = open_store(tmp_path / "store", create=True)
    _fill(root, 4)
    compact(root, SCHEMAS)
    _later()
    write_rows(root, "traces", "k001", [_trace_row("k001", "/t/k001.json", 5.0)])
    write_rows(root, "findings", "k001", [])  # its findings are now none: the empty file claims the key
    traces = read_table(root, "traces").set_index("key")
    assert len(traces) == 4 and traces.loc["k001", "mean_step_us"] == 5.0
    assert sorted(read_table(root, "findings")["key"]) == ["k003", "k003"]
    assert read_rows(root, "traces", "k001")[0]["mean_step_us"] == 5.0
    assert read_rows(root, "traces", "k002")[0]["mean_step_us"] == 1002.0  # from the part
    assert read_rows(root, "traces", "nope") is None
    _later()
    assert compact(root, SCHEMAS) == {"traces": 2, "findings": 2}  # the new single file and the small part it overrides
    assert len(_files(root, "traces")) == 1 and len(_files(root, "findings")) == 1
    duckdb = pytest.importorskip("duckdb")
    assert duckdb.sql(f"SELECT key, mean_step_us FROM read_parquet('{root}/traces/*.parquet') "
                      "ORDER BY key").fetchall() == [("k000", 1000.0), ("k001", 5.0), ("k002", 1002.0),
                                                     ("k003", 1003.0)]
    assert duckdb.sql(f"SELECT key FROM read_parquet('{root}/findings/*.parquet')").fetchall() == [("k003",)] * 2


def test_between_a_compactions_rename_and_its_deletes_a_reader_sees_each_key_once(tmp_path):
    root = open_store(tmp_path / "store", create=True)
    _fill(root, 3)
    singles = {name: (root / "traces" / name).read_bytes() for name in _files(root, "traces")}
    compact(root, {"traces": SCHEMAS["traces"]})
    for name, data in singles.items():  # the merged files back beside the part, as before the deletes
        (root / "traces" / name).write_bytes(data)
        os.utime(root / "traces" / name, ns=(1, 1))  # written before the part
    assert len(_files(root, "traces")) == 4
    assert sorted(read_table(root, "traces")["key"]) == ["k000", "k001", "k002"]


def test_one_compaction_at_a_time(tmp_path):
    root = open_store(tmp_path / "store", create=True)
    _fill(root, 3)
    (root / ".compact.lock").write_text("12345")
    assert compact(root, SCHEMAS) is None  # another compaction holds the lock: nothing done, and said so
    assert len(_files(root, "traces")) == 3
    os.utime(root / ".compact.lock", (time.time() - 3600, time.time() - 3600))  # left by a compaction that died
    assert compact(root, SCHEMAS) == {"traces": 3, "findings": 3}
    assert not (root / ".compact.lock").exists()


def test_resume_finds_a_file_whose_row_was_compacted(tmp_path):
    traces = [tmp_path / "run.json", tmp_path / "other.json"]
    for n, trace in enumerate(traces):
        b = TraceBuilder()
        for step in range(5 + n):
            b.step(step, step * 1000, 1000).loader(step * 1000, 100).kernel(step * 1000 + 100, 800)
        b.write(trace)
    root = open_store(tmp_path / "store", create=True)
    first, _ = (analyze_file(str(t), "job", 0, str(root)) for t in traces)
    assert first["status"] == "ok" and first["steps"] == 5
    compact(root, SCHEMAS)
    assert not (root / "traces" / f"{first['key']}.parquet").exists()
    again = analyze_file(str(traces[0]), "job", 0, str(root), resume=True)
    assert again["skipped"] is True and again["key"] == first["key"] and again["steps"] == 5
    assert _files(root, "traces")[0].startswith("part-") and len(_files(root, "traces")) == 1
