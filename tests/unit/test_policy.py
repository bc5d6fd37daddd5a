"""The severity policy: one function every finding goes through, severity from what its fix is worth."""

from __future__ import annotations

import pytest

from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import NATURE, Finding
from kinetoscope.analyze.report.policy import RunTime, judge, limit, worth

CONFIG = AnalysisConfig()
#: a rank whose replayed mean step is 100 ms, 1,000 steps timed over 100 s, a 500 ms window
RUN = RunTime(mean_step_us=100_000.0, run_steps=1000, run_wall_us=100_000_000.0, window_us=500_000.0)


def finding(fid: str = "loader_stall", saving_us: float | None = None, **kw) -> Finding:
    estimate = kw.pop("estimate", None if saving_us is None else {"saving_us_per_step": saving_us})
    return Finding(id=fid, rank=0, title="t", evidence={}, recommendation="", estimate=estimate, **kw)


@pytest.mark.parametrize("saving_us, severity", [
    (0.0, "info"), (2_999.0, "info"), (3_000.0, "warning"), (24_999.0, "warning"), (25_000.0, "critical"),
])
def test_a_cost_is_as_severe_as_its_fix_is_worth(saving_us, severity):
    judged = judge(finding(saving_us=saving_us), RUN, CONFIG)
    assert judged.severity == severity
    assert judged.worth is not None
    assert judged.worth.to_dict() == {"fraction": round(saving_us / 100_000, 4),
                                      "of": "the rank's mean step time (replayed)", "basis": "estimate"}


def test_the_analyzers_own_guess_does_not_count_for_a_cost():
    assert judge(finding(saving_us=40.0, severity="critical"), RUN, CONFIG).severity == "info"


def test_without_an_estimate_the_measured_cost_stands_in_for_half_of_itself():
    # a fix removes at most what the cost measured: a bound, credited at half (upper_bound_credit)
    judged = judge(finding(impact_us=400_000.0), RUN, CONFIG)  # 80% of a 500 ms window: 40%, critical
    assert judged.severity == "critical"
    assert judged.worth.basis == "measured cost" and judged.worth.fraction == 0.8
    assert judge(finding(impact_us=200_000.0), RUN, CONFIG).severity == "warning"  # 40%: 20%
    assert judge(finding(impact_us=25_000.0), RUN, CONFIG).severity == "info"  # 5%: 2.5%
    assert judge(finding(), RUN, CONFIG).severity == "info" and judge(finding(), RUN, CONFIG).worth.fraction is None


def test_a_one_off_cost_is_amortised_over_the_run():
    # a recompile of 3,768 ms once, in a run of 100 s: 3.8% of the run, a warning; in a 1,000 s run, 0.4%: info
    judged = judge(finding("recompile", saving_us=3_768_000.0, one_off_us=3_768_000.0), RUN, CONFIG)
    assert judged.worth is not None
    assert judged.worth.to_dict() == {"fraction": 0.0377, "of": "the run's time (1000 steps timed by the capture)",
                                      "basis": "one-off total", "one_off_total_us": 3_768_000.0}
    assert judged.severity == "warning"
    long_run = RunTime(100_000.0, 10_000, 1_000_000_000.0, 500_000.0)
    assert judge(finding("recompile", one_off_us=3_768_000.0), long_run, CONFIG).severity == "info"


def test_a_one_off_without_the_runs_length_is_judged_over_the_window_and_says_so():
    run = RunTime(100_000.0, None, None, 500_000.0)
    judged = judge(finding("recompile", one_off_us=100_000.0), run, CONFIG)
    assert judged.worth.fraction == 0.2 and "run's length is not known" in judged.worth.of
    assert judged.severity == "warning"


def test_the_ceiling_bounds_the_severity_and_says_why_in_the_title():
    capped = limit(finding(saving_us=50_000.0), "warning", "steps inferred")
    judged = judge(capped, RUN, CONFIG)
    assert judged.severity == "warning" and judged.title == "t (steps inferred)"
    # a ceiling that does not lower the finding leaves its title alone
    assert judge(limit(finding(saving_us=5_000.0), "warning", "steps inferred"), RUN, CONFIG).title == "t"
    # a lower ceiling wins over a higher one given later
    twice = limit(limit(finding(saving_us=50_000.0), "info", "partial"), "warning", "inferred")
    assert judge(twice, RUN, CONFIG).severity == "info" and judge(twice, RUN, CONFIG).title == "t (partial)"


def test_correctness_keeps_its_own_rule_and_information_is_always_info():
    wrong = Finding(id="zero_grad_missing", rank=0, title="t", evidence={}, recommendation="", severity="critical")
    assert judge(wrong, RUN, CONFIG).severity == "critical" and judge(wrong, RUN, CONFIG).worth is None
    assert judge(limit(wrong, "info", "partial step"), RUN, CONFIG).severity == "info"
    info = finding("gpu_activity_missing", saving_us=90_000.0, severity="critical")
    assert judge(info, RUN, CONFIG).severity == "info"


def test_an_upper_bound_estimate_counts_for_half_of_itself():
    bound = finding(saving_us=40_000.0)
    bound = Finding(**{**bound.__dict__, "estimate": {"saving_us_per_step": 40_000.0, "bound": "upper"}})
    judged = judge(bound, RUN, CONFIG)  # 40% of the step, credited 20%: a warning, not critical
    assert judged.severity == "warning" and judged.worth.basis == "upper bound" and judged.worth.fraction == 0.4
    assert judge(bound, RUN, AnalysisConfig(upper_bound_credit=1.0)).severity == "critical"


def test_the_thresholds_come_from_the_config():
    strict = AnalysisConfig(severity_warning_min_worth=0.01, severity_critical_min_worth=0.10)
    assert judge(finding(saving_us=1_500.0), RUN, strict).severity == "warning"
    assert judge(finding(saving_us=10_000.0), RUN, strict).severity == "critical"


def test_every_finding_id_has_a_nature():
    assert set(NATURE.values()) == {"cost", "correctness", "information"}
    assert worth(finding("gpu_idle", saving_us=1.0), RUN).basis == "estimate"


def test_a_fix_worth_nothing_is_not_advised():
    """Was: 'raise num_workers' repeated after 2 -> 4 workers gained nothing."""
    f = Finding(id="loader_stall", rank=0, title="t", recommendation="raise num_workers",
                evidence={"advice_if_no_gain": "more workers would not help"}, estimate={"saving_us_per_step": 100.0})
    assert judge(f, RUN, CONFIG).recommendation == "more workers would not help"  # 0.1% of the step
    worth_it = Finding(**{**f.__dict__, "estimate": {"saving_us_per_step": 10_000.0}})
    assert judge(worth_it, RUN, CONFIG).recommendation == "raise num_workers"


def _estimate(by_step_us: tuple[float, ...]):
    from kinetoscope.analyze.model.estimate import Estimate

    mean = sum(by_step_us) / len(by_step_us)
    return Estimate(step_us_after=0.0, saving_us_per_step=mean, saving_fraction=None, method="replay: x",
                    assumptions=(), saving_by_step_us=by_step_us)


#: a window of 5 steps, the last an epoch's end (50 ms, 5x the median); a run of 20 timed steps, 2 of them epoch ends
SPLIT_RUN = RunTime(mean_step_us=18_000.0, run_steps=20, run_wall_us=18 * 10_000.0 + 2 * 50_000.0, window_us=90_000.0,
                    window_steps_us=(10_000.0,) * 4 + (50_000.0,), run_steps_us=(10_000.0,) * 18 + (50_000.0,) * 2)


def test_a_saving_in_an_epochs_end_counts_as_often_as_the_run_has_epoch_ends():
    """Was: the window's mean saving (4.8 ms) over its mean step (18 ms): 27%, as if every 5th step of the run ended an
    epoch. 1 ms in each ordinary step stands for the run's 18, 20 ms in the epoch end for the run's 2: 58 ms of a
    280 ms run, 20.7%."""
    judged = judge(finding("straggler", estimate=_estimate((1_000.0,) * 4 + (20_000.0,))), SPLIT_RUN, CONFIG)
    assert judged.worth.fraction == pytest.approx(58_000 / 280_000)
    assert judged.worth.of.startswith("the run's time (20 steps timed by the capture; the window's 1 step(s) of 3x")
    assert judged.severity == "warning"


def test_alike_steps_keep_the_mean_step_rule():
    run = RunTime(mean_step_us=10_000.0, run_steps=20, run_wall_us=200_000.0, window_us=50_000.0,
                  window_steps_us=(10_000.0,) * 5, run_steps_us=(10_000.0,) * 20)
    judged = judge(finding("straggler", estimate=_estimate((1_000.0,) * 5)), run, CONFIG)
    assert judged.worth.of == "the rank's mean step time (replayed)" and judged.worth.fraction == 0.1


def test_a_cost_per_event_stands_for_the_runs_events():
    """One worker restart in the window, worth 5 ms a step over its 5 steps (25 ms); the capture counted 3 over the
    run: 75 ms of a 280 ms run (26.8%, critical), not the window's rate (5 ms of every 18 ms step)."""
    f = finding("worker_respawn", estimate=_estimate((0.0,) * 4 + (25_000.0,)), run_events=(1, 3))
    judged = judge(f, SPLIT_RUN, CONFIG)
    assert judged.worth.fraction == pytest.approx(75_000 / 280_000)
    assert judged.worth.of.endswith("the window's 1 event(s) stand for the run's 3)") and judged.severity == "critical"


def by_step_finding(savings_us: list[float]) -> Finding:
    from kinetoscope.analyze.model.estimate import Estimate

    mean = 20_000.0
    saving = sum(savings_us) / len(savings_us)
    est = Estimate(step_us_after=mean - saving, saving_us_per_step=saving, saving_fraction=saving / mean,
                   method="replay", assumptions=(), saving_by_step_us=tuple(savings_us))
    return Finding(id="exposed_comm", rank=0, title="t", evidence={}, recommendation="", estimate=est)


def test_a_recurring_saving_counts_for_nothing_in_a_compilation_the_window_does_not_show():
    """Was: a DDP job under torch.compile, exposed 32% of its window's mean step, was a warning; its 14.5 s run spent
    12.3 s compiling, and the consensus read under 3% of the run (a bound at half). Window: ten 20 ms steps, each
    saving 5 ms (a quarter of its time). Run: a 10 s step that compiles (3x its median or more) and 99 of 16 ms: the
    quarter of the 1,584 ms of ordinary steps, 396 ms of 11,584 ms (was: 5 of 20 ms, 25%, critical)."""
    run = RunTime(mean_step_us=20_000.0, run_steps=100, run_wall_us=11_584_000.0, window_us=200_000.0,
                  window_steps_us=(20_000.0,) * 10, run_steps_us=(10_000_000.0,) + (16_000.0,) * 99)
    value = worth(by_step_finding([5_000.0] * 10), run, CONFIG)
    assert value.fraction == pytest.approx(396_000 / 11_584_000, rel=1e-12)
    assert "its 99 ordinary ones" in value.of and "1 step(s)" in value.of


def test_a_window_slowed_by_the_profiler_saves_its_share_of_the_runs_steps_not_its_own_milliseconds():
    """Was: the window's saving per step, so a profiled window slower than the run saved its own milliseconds from
    the run's shorter steps (the fifth set's rank 0 of a DDP job: exposure 53% of the run, critical; both readers: a
    warning). Window: nine ordinary 15 ms steps saving 3 ms (a fifth) and a 60 ms epoch's end saving 30 ms (half).
    Run: 90 ordinary 10 ms steps and 2 of 50 ms: a fifth of 900 ms and half of 100 ms, 230 of 1,000 ms (was: 3 ms x
    90 + 30 ms x 2, 33%)."""
    run = RunTime(mean_step_us=19_500.0, run_steps=92, run_wall_us=1_000_000.0, window_us=195_000.0,
                  window_steps_us=(15_000.0,) * 9 + (60_000.0,), run_steps_us=(10_000.0,) * 90 + (50_000.0,) * 2)
    value = worth(by_step_finding([3_000.0] * 9 + [30_000.0]), run, CONFIG)
    assert value.fraction == pytest.approx(0.23, rel=1e-12)


def test_a_finding_judged_again_keeps_the_window_steps_it_was_first_judged_on():
    """Was: a rank's exposure judged again once its waits for later ranks were known lost the window's steps, and its
    saving spread over the run alike (the other rank's, never re-judged, kept them): of the compiling job's ranks, one
    was information and the other a warning on the same numbers."""
    from dataclasses import replace

    from kinetoscope.analyze.report.builder import _judged_again

    run = RunTime(mean_step_us=20_000.0, run_steps=100, run_wall_us=11_584_000.0, window_us=200_000.0,
                  window_steps_us=(20_000.0,) * 10, run_steps_us=(10_000_000.0,) + (16_000.0,) * 99)
    first = judge(by_step_finding([5_000.0] * 10), run, CONFIG)
    again = _judged_again(replace(first, worth=None), None, 200_000.0, CONFIG)
    assert again.worth.fraction == pytest.approx(396_000 / 11_584_000, rel=1e-12)


def test_a_fix_that_costs_more_than_it_saves_removes_none_of_the_runs_cost():
    """A loader's waits measured over the run (10 s of the 100 s run), scaled by what the window's estimate removes of
    the window's cost: a replay whose fix makes the step 300 us longer removes none of it (0.0), never '-18%'."""
    steps = tuple([100_000.0] * 5)
    run = RunTime(100_000.0, 1000, 100_000_000.0, 500_000.0, window_steps_us=steps)
    judged = judge(finding(saving_us=-300.0, impact_us=50_000.0, run_cost_us=10_000_000.0, run_cost_scaled=True),
                   run, CONFIG)
    assert judged.worth.fraction == 0.0 and judged.severity == "info"
    assert "the fix removes 0% of it" in judged.worth.of
    judged = judge(finding(saving_us=5_000.0, impact_us=50_000.0, run_cost_us=10_000_000.0, run_cost_scaled=True),
                   run, CONFIG)  # 5 ms a step over 5 steps of a 50 ms cost: half of the run's 10%
    assert judged.worth.fraction == 0.05 and judged.severity == "warning"
