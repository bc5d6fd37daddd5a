"""The Estimate record: typed fields, the report's JSON object from them, and no clamping."""

from __future__ import annotations

import json

from kinetoscope.analyze.model.estimate import Estimate
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.report.builder import Report, estimate_violations
from kinetoscope.render.text import render_text


def test_a_fix_that_slows_the_step_is_reported_not_clamped():
    est = Estimate.of(100_000_000.0, 120_000_000.0, "replay: test", ("an edit that moves work later",))
    assert (est.step_us_after, est.saving_us_per_step, est.saving_fraction) == (120_000.0, -20_000.0, -0.2)
    assert est.violations() == ["estimate: the step ends 20,000.000 us later after the fix (replay: test): "
                                "a fix here only removes work"]


def test_a_step_that_ends_before_it_begins_is_a_violation():
    est = Estimate.of(1_000_000.0, -500_000.0, "one-off", ())
    assert est.step_us_after == -500.0
    assert len(est.violations()) == 1 and "below zero" in est.violations()[0]


def test_a_saving_is_no_violation():
    assert Estimate.of(100_000_000.0, 75_000_000.0, "replay: test", ()).violations() == []


def test_the_json_object_keeps_the_reports_key_order():
    est = Estimate.of(10_000_000.0, 8_000_000.0, "replay: DataLoader queue simulation", ("a", "b"),
                      details={"num_workers": 4, "cpus": 8}, bound="upper")
    assert list(est.to_dict()) == ["step_us_after", "saving_us_per_step", "saving_fraction", "fraction_of", "method",
                                   "assumptions", "num_workers", "cpus", "bound"]
    assert est.to_dict()["assumptions"] == ["a", "b"] and est["saving_us_per_step"] == 2000.0
    one_off = Estimate.of(10_000_000.0, 9_000_000.0, "one-off", (), one_off_total_us=5000.0, amortised_over_steps=5)
    assert list(one_off.to_dict())[-2:] == ["one_off_total_us", "amortised_over_steps"]


def test_a_findings_estimate_is_written_as_its_json_object():
    est = Estimate.of(2_000_000.0, 1_500_000.0, "measured: compile time", ("x",))
    f = Finding(id="recompile", rank=0, title="t", evidence={}, recommendation="r", estimate=est)
    assert json.loads(json.dumps(f.to_dict()))["estimate"] == {
        "step_us_after": 1500.0, "saving_us_per_step": 500.0, "saving_fraction": 0.25,
        "fraction_of": "the rank's mean step time (replayed)", "method": "measured: compile time", "assumptions": ["x"]}


def test_the_report_lists_an_estimate_violation():
    """How a slowing fix surfaces: with the report's invariant violations (the JSON's invariant_violations, the text
    report's 'Numbers that break an invariant' section); a saving adds none."""
    slow = Finding(id="sync_in_loop", rank=0, title="t", evidence={}, recommendation="r",
                   estimate=Estimate.of(100_000_000.0, 110_000_000.0, "replay: test", ()))
    fine = Finding(id="loader_stall", rank=1, title="t", evidence={}, recommendation="r",
                   estimate=Estimate.of(100_000_000.0, 90_000_000.0, "replay: test", ()))
    violations = estimate_violations([slow, fine])
    assert violations == ["finding sync_in_loop (rank 0): estimate: the step ends 10,000.000 us later after the fix "
                          "(replay: test): a fix here only removes work"]
    report = Report(source="x", ranks=(), findings=(slow, fine), job={}, violations=tuple(violations))
    assert report.to_dict()["invariant_violations"] == violations
    assert "Numbers that break an invariant" in render_text(report)
