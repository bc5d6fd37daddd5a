"""Issue 28, item 6: the step change is the mean time per step, with an interval from batch means of whole periods.
Step series built in code, each with its answer known by construction: bursts (4 DataLoader workers: 3 fast steps,
1 slow), periods (a validation step every 10), identical runs, and a coverage check that a period cannot fool."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kinetoscope.analyze.report.compare import RunSteps, gate, series_change
from kinetoscope.analyze.report.steptime import detect_period, summarize, t_quantile


def steps(wall_us) -> RunSteps:
    return RunSteps(0, np.asarray(wall_us, dtype=np.float64), "capture")


# bursts: with 4 workers that cannot keep up, the loop waits 36 ms for a batch and finds the next three ready
BURSTY = np.tile([2000.0, 2000.0, 2000.0, 38000.0], 25)  # 100 steps, mean 11 ms, median 2 ms
# periods: 9 training steps of 10 ms, then one that also runs a 40 ms validation pass
PERIODIC = np.tile([10000.0] * 9 + [50000.0], 10)  # 100 steps, mean 14 ms, median 10 ms


def test_student_t_quantiles_match_the_tables():
    assert [round(t_quantile(0.975, df), 3) for df in (1, 2, 7, 30, math.inf)] == [12.706, 4.303, 2.365, 2.042, 1.960]
    assert round(t_quantile(0.995, 10), 3) == 3.169


def test_periods_are_found_in_bursts_validation_and_both():
    rng = np.random.default_rng(0)
    assert detect_period(BURSTY) == 4
    assert detect_period(PERIODIC + rng.normal(0, 500, 100)) == 10
    both = np.tile([10000.0] * 9 + [50000.0], 20) + np.tile([0.0, 0.0, 0.0, 20000.0], 50) + rng.normal(0, 500, 200)
    assert detect_period(both) == 20  # the least common multiple: a batch of 20 holds whole cycles of both
    assert detect_period(10000.0 + rng.normal(0, 500, 200)) == 1  # noise repeats nothing
    assert detect_period(np.full(100, 7.0)) == 1
    assert detect_period(PERIODIC[:39]) == 1  # fewer than four cycles: not a period


def test_batches_hold_whole_periods_about_twenty_a_run():
    s = summarize(PERIODIC + np.random.default_rng(1).normal(0, 500, 100))
    assert (s.period_steps, s.batch_steps, s.batches) == (10, 10, 10)
    s = summarize(np.random.default_rng(2).normal(10000, 500, 1000))
    assert (s.period_steps, s.batch_steps, s.batches) == (1, 50, 20)
    s = summarize(np.tile(BURSTY, 4))  # 400 steps of period 4: batches of 20 (5 cycles), 20 of them
    assert (s.period_steps, s.batch_steps, s.batches, s.mean_us, s.mean_se_us) == (4, 20, 20, 11000.0, 0.0)


def test_identical_runs_read_as_no_change():
    for series in (BURSTY, PERIODIC):
        c = series_change(steps(series), steps(series.copy()))
        assert (c.change, c.ci_low, c.ci_high, c.verdict) == (0.0, 0.0, 0.0, "no change")


def test_a_bursty_speed_up_reads_as_its_mean_change_while_the_median_says_the_opposite():
    """After: the loader keeps up, every step 6.16 ms: the mean falls 44% (11 -> 6.16 ms), the median rises 208%
    (2 -> 6.16 ms). The median is not used: it lies outside the mean's interval."""
    c = series_change(steps(BURSTY), steps(np.full(100, 6160.0)))
    assert c.change == pytest.approx(-0.44, abs=1e-12) and c.verdict == "faster"
    assert c.ci_low == pytest.approx(-0.44, abs=1e-12) and c.ci_high == pytest.approx(-0.44, abs=1e-12)
    assert c.median_change == pytest.approx(2.08, abs=1e-12) and c.median_agrees is False
    assert (c.before.stats.mean_us, c.before.stats.median_us, c.before.stats.period_steps) == (11000.0, 2000.0, 4)
    rng = np.random.default_rng(3)
    before, after = BURSTY + rng.normal(0, 300, 100), 6160.0 + rng.normal(0, 300, 100)
    c = series_change(steps(before), steps(after))
    assert c.change == pytest.approx(after.mean() / before.mean() - 1, abs=1e-12)
    assert c.ci_low < -0.44 < c.ci_high < 0 and c.verdict == "faster" and c.median_agrees is False


def test_a_periodic_regression_of_12_percent_fails_a_5_percent_gate_and_passes_15():
    """The validation step grows from 50 to 66.8 ms: the mean from 14 to 15.68 ms (+12%); the median (a training
    step, 10 ms) does not move."""
    rng = np.random.default_rng(4)
    after_exact = np.tile([10000.0] * 9 + [66800.0], 10)
    c = series_change(steps(PERIODIC), steps(after_exact))
    assert c.change == pytest.approx(0.12, abs=1e-12) and c.median_change == 0.0 and c.median_agrees is False
    before, after = PERIODIC + rng.normal(0, 500, 100), after_exact + rng.normal(0, 500, 100)
    c = series_change(steps(before), steps(after))
    assert c.change == pytest.approx(after.mean() / before.mean() - 1, abs=1e-12)
    assert 0.05 < c.ci_low < 0.12 < c.ci_high < 0.15 and c.verdict == "slower"
    assert (c.before.stats.period_steps, c.before.stats.batches) == (10, 10)
    failed, passed = gate(c, 0.05), gate(c, 0.15)
    assert (failed.regressed, failed.basis) == (True, "interval") and passed.regressed is False


def test_identical_runs_with_noise_read_as_no_change():
    """The same steps in another order (the bursts at another phase, the noise landing elsewhere): the same total
    time, so exactly no change, whatever the median or the batches say."""
    rng = np.random.default_rng(5)
    for series in (BURSTY, PERIODIC):
        noisy = series + rng.normal(0, 400, 100)
        later = np.roll(noisy, 3)  # the run's bursts or validations three steps later
        later[:20] = rng.permutation(later[:20])
        c = series_change(steps(noisy), steps(later))
        assert c.change == pytest.approx(0.0, abs=1e-12) and c.ci_low < 0 < c.ci_high and c.verdict == "no change"


def test_independent_identical_runs_read_as_no_change_and_the_interval_holds_95_percent():
    """Identical processes, independent noise: the 95% interval holds the true change, 0, in 95% of 400 pairs (it
    cannot do better), every pair reads 'no change' (the changes it excludes are within the 2% reruns of one job
    differ by), and none fails a 5% gate."""
    for series in (BURSTY, PERIODIC):
        verdicts, covered, gated = [], 0, 0
        for seed in range(400):
            rng = np.random.default_rng(seed)
            c = series_change(steps(series + rng.normal(0, 400, 100)), steps(series + rng.normal(0, 400, 100)))
            verdicts.append(c.verdict)
            covered += c.ci_low <= 0 <= c.ci_high
            gated += gate(c, 0.05).regressed
        assert 0.92 <= covered / 400 <= 0.98 and gated == 0  # measured: 0.9375 for both
        assert verdicts.count("no change") == 400


def _post_validation_run(rng: np.random.Generator, periods: int = 20) -> np.ndarray:
    """Validation every 10 steps (+5 ms); the 5 steps after it run at a speed drawn once per pass (the workers
    restarting: +4 ms, +-4 ms), so slow steps cluster inside each period."""
    runs = []
    for _ in range(periods):
        p = 10000.0 + rng.normal(0, 300, 10)
        p[0] += 5000.0 + rng.normal(0, 500)
        p[1:6] += rng.normal(4000.0, 4000.0)
        runs.append(p)
    return np.concatenate(runs)


def _iid_bootstrap(a: np.ndarray, b: np.ndarray, rng: np.random.Generator,
                   resamples: int = 2000) -> tuple[float, float]:
    """A bootstrap with blocks of one step, the interval a period fools."""
    ra = a[rng.integers(0, len(a), (resamples, len(a)))].mean(axis=1)
    rb = b[rng.integers(0, len(b), (resamples, len(b)))].mean(axis=1)
    low, high = np.quantile(rb / ra - 1, [0.025, 0.975])
    return float(low), float(high)


def test_a_period_cannot_fool_the_interval():
    """200 pairs of identical runs (independent draws of the same process). Resampling single steps ignores that
    the slow steps of a period come together: its interval covers 0 in 139 pairs (69.5%, not 95%), so it would
    call a third of identical runs changed. Batch means of whole periods cover 0 in 184 (92%; 94.6% over 3000
    pairs, as a 95% interval should)."""
    ours = iid = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        a, b = _post_validation_run(rng), _post_validation_run(rng)
        c = series_change(steps(a), steps(b))
        ours += c.ci_low <= 0 <= c.ci_high
        low, high = _iid_bootstrap(a, b, rng)
        iid += low <= 0 <= high
    assert ours / 200 >= 0.90 and iid / 200 <= 0.80, (ours, iid)


def test_a_stall_moves_the_mean_and_the_median_says_otherwise():
    """Was (issue-18 review, with the median): one burst of eight 24 ms steps in 60 steps of 0.5 ms read as
    'no change'. The stall is 188 ms of a 218 ms run: the run's time per step did grow 7-fold, and the mean says
    so; the median (+0.4%) lies outside the mean's interval and is not used. A 6-fold slowdown of every step
    against that stalled run: the mean moved -17% with an interval too wide to tell (the stall dominates the
    before run), the median +498% disagrees and is said."""
    rng = np.random.default_rng(0)
    calm = 500.0 + rng.normal(0, 10, 60)
    stall = calm.copy()
    stall[20:28] = 24_000.0
    slow = 3000.0 + rng.normal(0, 60, 60)
    c = series_change(steps(calm), steps(stall))
    assert c.change == pytest.approx(stall.mean() / calm.mean() - 1, abs=1e-12) and c.verdict == "slower"
    assert c.median_change == pytest.approx(np.median(stall) / np.median(calm) - 1) and c.median_agrees is False
    c = series_change(steps(stall), steps(slow))
    assert c.change == pytest.approx(slow.mean() / stall.mean() - 1, abs=1e-12) and c.verdict == "no change"
    assert c.median_change == pytest.approx(np.median(slow) / np.median(stall) - 1) and c.median_agrees is False
    c = series_change(steps(calm), steps(slow))  # without the stall, both say the same
    assert c.verdict == "slower" and c.ci_low > 4.9 and c.median_agrees is True


def test_one_sample_a_run_has_no_interval_and_the_gate_compares_the_values():
    c = series_change(RunSteps(0, np.array([1000.0]), "window"), RunSteps(0, np.array([1100.0]), "window"))
    assert c.statistic == "window" and c.verdict == "unknown" and c.ci_low is None
    assert c.change == pytest.approx(0.1) and gate(c, 0.05).regressed and gate(c, 0.05).basis == "change"
    assert not gate(c, 0.2).regressed
