"""Time per step over a run, and how it changed between two runs, with an interval that bursts and periods
cannot fool.

The statistic is the **mean** step time: the run's total step time over its step count, what its length follows
(epochs per hour). Training steps are not independent draws around a typical value. DataLoader workers deliver
batches in bursts (with N workers, often N-1 fast steps and one slow one), validation or an epoch's restart puts a
slow step every K steps, and a stall slows several consecutive steps. On such series the median jumps between the
fast and the slow mode (on real training code, identical runs read +78%, a 44% speed-up -89%), while the mean moves
only by what the run's length moves.

The interval (``change_of_means``) comes from **batch means of whole periods**: each run is cut into consecutive
batches whose length is a multiple of the longest period found in its step times (``detect_period``), about 20
batches a run, and the spread of the batch means gives the mean's standard error; the two runs' errors combine on
the log of the ratio with Welch's degrees of freedom and a Student t quantile. Why this and not a bootstrap:

- A batch of whole periods holds every phase of the period equally often, so where a burst or a validation step
  falls cannot move a batch mean: the spread left is the run-to-run variability of whole periods, which is what
  the mean is uncertain about. Resampling single steps (a bootstrap with blocks of 1) treats steps as independent:
  it is too confident wherever slow steps cluster inside a period (a slow stretch after each validation, an epoch
  that is slow as a whole), and claims a change between identical runs (tests: ``test_steptime.py``).
- Batches longer than a period (about n/20 steps) also hold the correlation between neighbouring steps (stalls).
- Captures are short (tens of steps, a handful of periods): with few batches a bootstrap's percentile interval is
  too narrow, while Student's t with the batches' degrees of freedom widens it as it should. And the interval is
  deterministic: the same two runs give the same interval, with no seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

#: the number of batches a run is cut into where its length allows (Schmeiser 1982: 10 to 30 batches
#: balance the bias of short batches against the noise of few)
TARGET_BATCHES = 20
#: a period must repeat at least this many times in a run to be found (fewer cannot be told from chance)
MIN_CYCLES = 4
#: the longest period looked for (the search costs a pass over the run per candidate)
MAX_PERIOD = 500
#: the periods are looked for in the run's first this many steps (each candidate costs a pass over them; ten cycles
#: of the longest period are plenty; 20,000 steps took 0.3 s a rank and run)
PERIOD_SEARCH_STEPS = 5_000
#: the chance, over all candidate periods together, of finding a period in steps that have none
PERIOD_FALSE_ALARM = 0.01


@dataclass(frozen=True)
class SeriesStats:
    """One run's step times (us), summarised for comparing runs."""

    steps: int
    total_us: float
    mean_us: float
    median_us: float
    #: the longest period found in the step times (steps; 1: none found): batches hold whole periods
    period_steps: int
    #: steps per batch (a multiple of ``period_steps``) and how many whole batches the run holds; the steps
    #: after the last whole batch count in the mean but not in its error
    batch_steps: int
    batches: int
    #: standard error of ``mean_us`` from the batch means; None with fewer than 2 batches
    mean_se_us: float | None


def summarize(wall_us: np.ndarray) -> SeriesStats:
    x = np.asarray(wall_us, dtype=np.float64)
    n = len(x)
    if n == 0:
        raise ValueError("no steps")
    period = detect_period(x)
    per_batch = period * max(1, n // (TARGET_BATCHES * period))
    batches = n // per_batch
    se = None
    if batches >= 2:
        means = x[:batches * per_batch].reshape(batches, per_batch).mean(axis=1)
        se = float(np.std(means, ddof=1) / math.sqrt(batches))
    return SeriesStats(steps=n, total_us=float(x.sum()), mean_us=float(x.mean()), median_us=float(np.median(x)),
                       period_steps=period, batch_steps=per_batch, batches=batches, mean_se_us=se)


@dataclass(frozen=True)
class MeanChange:
    """after / before - 1 of the mean step, with its 95% interval (None where either run has < 2 batches)."""

    change: float | None
    ci_low: float | None
    ci_high: float | None
    #: Welch's degrees of freedom of the interval (None: no interval; inf: both runs without spread)
    df: float | None
    median_change: float | None


def change_of_means(before: SeriesStats, after: SeriesStats) -> MeanChange:
    """The change of the mean step and its 95% interval: log(after/before) +- t * se, se from each run's batch
    means (relative errors add in quadrature on the log scale), t with Welch-Satterthwaite degrees of freedom."""
    if before.mean_us <= 0:
        return MeanChange(None, None, None, None, None)
    ratio = after.mean_us / before.mean_us
    median = after.median_us / before.median_us - 1.0 if before.median_us > 0 else None
    if before.mean_se_us is None or after.mean_se_us is None or ratio <= 0:
        return MeanChange(ratio - 1.0, None, None, None, median)
    va = (before.mean_se_us / before.mean_us) ** 2
    vb = (after.mean_se_us / after.mean_us) ** 2
    if va + vb == 0:
        return MeanChange(ratio - 1.0, ratio - 1.0, ratio - 1.0, math.inf, median)
    df = (va + vb) ** 2 / (va ** 2 / (before.batches - 1) + vb ** 2 / (after.batches - 1))
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    return MeanChange(ratio - 1.0, ratio * math.exp(-half) - 1.0, ratio * math.exp(half) - 1.0, df, median)


# --- periods ---------------------------------------------------------------------------------------------
def detect_period(x: np.ndarray, max_period: int = MAX_PERIOD) -> int:
    """The period (in steps) of the pattern the step times repeat, or 1 where none is found: the least common
    multiple of up to three periods, found one after the other (in the first ``PERIOD_SEARCH_STEPS`` steps).

    Each candidate period p (2 to n/4: at least four cycles) folds the run onto p phases; an F test asks whether
    the phases' means differ more than the steps within a phase (one-way analysis of variance), and the candidate
    with the smallest p-value wins if it is below ``PERIOD_FALSE_ALARM`` divided by the number of candidates. A
    multiple of the true period explains the same spread with more phases and so has a larger p-value: the
    fundamental wins. The winner's phase means are taken out and the search repeats on what is left, so a burst
    cycle and a validation every K steps are both found (batches then hold whole cycles of both)."""
    x = np.asarray(x, dtype=np.float64)[:PERIOD_SEARCH_STEPS]
    n = len(x)
    top = min(max_period, n // MIN_CYCLES)
    if top < 2:
        return 1
    rest = x - x.mean()
    steps, phase = np.arange(n), np.empty(n, dtype=np.int64)
    found = 1
    for _ in range(3):
        best, best_logp = 0, 0.0
        limit = math.log(PERIOD_FALSE_ALARM / (top - 1))
        for p in range(2, top + 1):
            np.remainder(steps, p, out=phase)
            logp = _fold_log_pvalue(rest, p, phase)
            if logp < best_logp - 1e-9 or (best == 0 and logp < 0):
                best, best_logp = p, logp
        if best == 0 or best_logp >= limit:
            break
        together = math.lcm(found, best)
        if together > top:
            break
        found = together
        rest = rest - _phase_means(rest, best)[steps % best]
        rest -= rest.mean()
    return found


def _phase_means(x: np.ndarray, p: int) -> np.ndarray:
    phase = np.arange(len(x)) % p
    return np.bincount(phase, weights=x, minlength=p) / np.bincount(phase, minlength=p)


def _fold_log_pvalue(x: np.ndarray, p: int, phase: np.ndarray | None = None) -> float:
    """log of the F test's p-value that the run, folded on ``p`` phases, has phase means that differ (``x``
    centred on 0; ``phase``: ``arange(n) % p``, where the caller has it)."""
    n = len(x)
    phase = np.arange(n) % p if phase is None else phase
    counts = np.bincount(phase, minlength=p)
    sums = np.bincount(phase, weights=x, minlength=p)
    total = float(np.dot(x, x))
    between = float(np.sum(sums * sums / counts))  # x is centred: the grand mean is 0
    within = total - between
    if total <= 1e-24:
        return 0.0  # a constant run: nothing repeats
    if within <= 1e-12 * total:
        return -math.inf  # the phases explain every step
    f = (between / (p - 1)) / (within / (n - p))
    return log_f_sf(f, p - 1, n - p)


# --- distributions (numpy has none, and the analysis does not depend on scipy) ---------------------------------
def log_f_sf(f: float, d1: float, d2: float) -> float:
    """log P(F > f) for an F(d1, d2) variable: log I_x(d2/2, d1/2) with x = d2 / (d2 + d1 f)."""
    if f <= 0:
        return 0.0
    return _log_betainc(d2 / 2.0, d1 / 2.0, d2 / (d2 + d1 * f))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (any df > 0; inf: the normal)."""
    if math.isinf(df):
        return NormalDist().cdf(t)
    tail = 0.5 * math.exp(_log_betainc(df / 2.0, 0.5, df / (df + t * t)))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t (0.5 <= q < 1), by bisection on ``t_cdf``."""
    if not 0.5 <= q < 1:
        raise ValueError("q must be in [0.5, 1)")
    if math.isinf(df) or df > 1e7:
        return NormalDist().inv_cdf(q)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < q:
        low, high = high, high * 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < q:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2.0


def _log_betainc(a: float, b: float, x: float) -> float:
    """log of the regularized incomplete beta function I_x(a, b), without underflow for tiny values: the
    continued fraction converges fast for x below (a + 1) / (a + b + 2); above, the symmetry
    I_x(a, b) = 1 - I_(1-x)(b, a) is used."""
    if x <= 0:
        return -math.inf
    if x >= 1:
        return 0.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return log_front + math.log(_beta_fraction(a, b, x) / a)
    other = math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b
    return math.log1p(-other) if other < 1 else -math.inf


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function, by the modified Lentz method."""
    tiny = 1e-300

    def guard(v: float) -> float:
        return v if abs(v) > tiny else tiny

    c, d = 1.0, 1.0 / guard(1.0 - (a + b) * x / (a + 1.0))
    value = d
    for m in range(1, 10_000):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 / guard(1.0 + even * d)
        c = guard(1.0 + even / c)
        value *= d * c
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 / guard(1.0 + odd * d)
        c = guard(1.0 + odd / c)
        step = d * c
        value *= step
        if abs(step - 1.0) < 1e-15:
            break
    return value
