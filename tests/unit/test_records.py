"""Typed results: a record writes its JSON keys in field order, leaves an UNSET key out, and a rank's typed entry
writes the report's rank entry whether its analyzers are typed or still give dicts."""

from __future__ import annotations

from dataclasses import replace

from kinetoscope.analyze.model.record import UNSET, Record, UnsetType
from kinetoscope.analyze.model.results import OpTime
from kinetoscope.analyze.report.builder import RankReport


class Inner(Record, frozen=True):
    b_us: float
    a: int


class Outer(Record, frozen=True, kw_only=True):
    z: Inner
    maybe: int | None | UnsetType = UNSET
    items: tuple[Inner, ...] = ()


def test_a_record_writes_its_fields_in_order_and_leaves_unset_ones_out():
    rec = Outer(z=Inner(b_us=1.5, a=2), items=(Inner(b_us=0.0, a=1),))
    assert list(rec.to_dict()) == ["z", "items"]
    assert rec.to_dict() == {"z": {"b_us": 1.5, "a": 2}, "items": [{"b_us": 0.0, "a": 1}]}
    assert list(Inner(b_us=1.0, a=3).to_dict()) == ["b_us", "a"]
    assert Outer(z=Inner(b_us=1.0, a=3), maybe=None).to_dict()["maybe"] is None  # None is written, UNSET is not


class ByOp(Record, frozen=True):
    by_op: dict[str, OpTime] | None


def _rank(analyses: dict) -> RankReport:
    return RankReport(rank=3, rank_source="trace", world_size=None, file="f.json", devices=None, events=10,
                      memory_events=0, warnings=[], unhandled_events={}, analyses=analyses, replay=None)


def test_a_rank_entry_mixes_typed_and_untyped_analyzers_in_the_registry_order():
    typed = ByOp(by_op={"all_reduce": OpTime(count=2, time_us=7.5)})
    rr = _rank({"typed": typed, "old": {"efficiency": {"mfu": 0.25}}, "failed_none": None})
    entry = rr.to_dict()
    assert list(entry)[-3:] == ["by_op", "efficiency", "replay"]
    assert entry["by_op"] == {"all_reduce": {"count": 2, "time_us": 7.5}} and entry["rank"] == 3
    assert rr.result(ByOp) is typed and rr.result(Inner) is None
    assert rr.value("efficiency") == {"mfu": 0.25}
    assert rr.value("by_op") == {"all_reduce": {"count": 2, "time_us": 7.5}}
    assert rr.value("absent") is None
    later = replace(rr, after_replay={"critical_path": {"steps": 2}})
    assert list(later.to_dict())[-2:] == ["replay", "critical_path"] and later.value("critical_path") == {"steps": 2}


def test_a_typed_block_after_the_replay_is_written_as_json_and_read_back_typed():
    block = Inner(b_us=1.5, a=2)
    rr = replace(_rank({}), after_replay={"comm_roles": None, "critical_path": block})
    entry = rr.to_dict()
    assert list(entry)[-3:] == ["replay", "comm_roles", "critical_path"]
    assert entry["comm_roles"] is None and entry["critical_path"] == {"b_us": 1.5, "a": 2}
    assert rr.result(Inner) is block and rr.value("critical_path") == {"b_us": 1.5, "a": 2}
