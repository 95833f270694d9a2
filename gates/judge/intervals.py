"""Confidence intervals that hold their stated level with the few repetitions a pilot can afford.

Every function is vectorised: the last axis holds the sample (repetitions, or windows), any leading axes
are independent problems (the calibration harness judges thousands of simulated pilots in one call).
docs/judge.md says which statistic uses which method and why; benchmarks/calibration/ measures the
coverage.

* `log_t` — a t-interval on the log of per-repetition statistics (TTFT percentiles, throughput): the
  repetitions are the independent units, and timing statistics are positive and multiplicative.
* `log_ratio` — Welch's t-interval on the difference of two arms' mean logs (speed-ups, reductions,
  gains: monotone maps of the ratio candidate ÷ baseline).
* `linear_t` — a t-interval on the raw values (hit ratios).
* `cv_chi2` — the interval of a coefficient of variation from (R − 1) s² / σ² ~ χ²(R − 1).
* `clopper_pearson` — exact bounds for a rate; `error_free_needed` — how many error-free requests
  show a rate bar at all.
* `drift_t` — late steady windows against early steady windows, Welch on the log scale.
* `quantile_order` — the distribution-free interval of a quantile from two order statistics.
"""
from __future__ import annotations

import math

import numpy as np

from gates.judge.lazy import stats


def _two_sided(confidence: float) -> float:
    return 1.0 - (1.0 - confidence) / 2.0


def log_t(values: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(geometric mean, low, high) of positive per-repetition statistics; NaN where fewer than 2 or not positive."""
    x = np.asarray(values, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(x > 0, np.log(np.where(x > 0, x, 1.0)), np.nan)
    r = x.shape[-1]
    mean = logs.mean(axis=-1)
    if r < 2:
        nan = np.full(mean.shape, np.nan)
        return np.exp(mean), nan, nan
    half = stats.t.ppf(_two_sided(confidence), r - 1) * logs.std(axis=-1, ddof=1) / math.sqrt(r)
    return np.exp(mean), np.exp(mean - half), np.exp(mean + half)


def log_ratio(candidate: np.ndarray, baseline: np.ndarray,
              confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratio, low, high) of candidate ÷ baseline from two arms' per-repetition statistics (Welch, log scale).

    An arm with one repetition contributes no variance of its own; the other arm's must then carry the
    interval (df of that arm); with one repetition on both sides the interval is NaN."""
    c = np.log(np.asarray(candidate, dtype=np.float64))
    b = np.log(np.asarray(baseline, dtype=np.float64))
    rc, rb = c.shape[-1], b.shape[-1]
    diff = c.mean(axis=-1) - b.mean(axis=-1)
    vc = c.var(axis=-1, ddof=1) / rc if rc > 1 else np.zeros(diff.shape)
    vb = b.var(axis=-1, ddof=1) / rb if rb > 1 else np.zeros(diff.shape)
    if rc < 2 and rb < 2:
        nan = np.full(diff.shape, np.nan)
        return np.exp(diff), nan, nan
    se2 = vc + vb
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = (vc ** 2 / (rc - 1) if rc > 1 else 0.0) + (vb ** 2 / (rb - 1) if rb > 1 else 0.0)
        df = np.where(terms > 0, se2 ** 2 / np.where(terms > 0, terms, 1.0), max(rc, rb) - 1)
    df = np.maximum(df, 1.0)
    half = stats.t.ppf(_two_sided(confidence), df) * np.sqrt(se2)
    return np.exp(diff), np.exp(diff - half), np.exp(diff + half)


def linear_t(values: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high): Student's t on the raw values."""
    x = np.asarray(values, dtype=np.float64)
    r = x.shape[-1]
    mean = x.mean(axis=-1)
    if r < 2:
        nan = np.full(mean.shape, np.nan)
        return mean, nan, nan
    half = stats.t.ppf(_two_sided(confidence), r - 1) * x.std(axis=-1, ddof=1) / math.sqrt(r)
    return mean, mean - half, mean + half


def cv_chi2(values: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(CV, low, high) of per-repetition statistics: s/x̄ with the χ² interval of s, (R − 1)s²/σ² ~ χ²(R − 1),
    widened where needed to Bonett's kurtosis-adjusted interval (2006), so heavy-tailed repetitions do not
    make the interval too short. The χ² interval is exact for normal repetitions; the mean's own error is of
    order CV²/R, far below the bars plans use (CV ≤ 0.1–0.2)."""
    x = np.asarray(values, dtype=np.float64)
    r = x.shape[-1]
    mean = x.mean(axis=-1)
    if r < 2:
        nan = np.full(mean.shape, np.nan)
        return nan, nan, nan
    with np.errstate(divide="ignore", invalid="ignore"):
        cv = x.std(axis=-1, ddof=1) / mean
    upper_q = stats.chi2.ppf(_two_sided(confidence), r - 1)
    lower_q = stats.chi2.ppf(1.0 - _two_sided(confidence), r - 1)
    low, high = cv * math.sqrt((r - 1) / upper_q), cv * math.sqrt((r - 1) / lower_q)
    if r >= 5:
        z = stats.norm.ppf(_two_sided(confidence))
        centred = x - mean[..., None]
        with np.errstate(divide="ignore", invalid="ignore"):
            kurtosis = r * (centred ** 4).sum(axis=-1) / ((centred ** 2).sum(axis=-1) ** 2)
            c = r / (r - z)
            se = c * np.sqrt(np.maximum(kurtosis - (r - 3) / r, 0.0) / (r - 1))
            b_low = cv * np.sqrt(c) * np.exp(-z * se / 2)
            b_high = cv * np.sqrt(c) * np.exp(z * se / 2)
        low, high = np.minimum(low, b_low), np.maximum(high, b_high)
    return cv, low, high


def clopper_pearson(failures: np.ndarray | int, n: np.ndarray | int,
                    confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(k/n, low, high): the exact binomial interval (each side holds at least its share of the level)."""
    k = np.asarray(failures, dtype=np.float64)
    total = np.asarray(n, dtype=np.float64)
    tail = (1.0 - confidence) / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = k / total
        low = np.where(k > 0, stats.beta.ppf(tail, np.maximum(k, 1e-12), total - k + 1), 0.0)
        high = np.where(k < total, stats.beta.ppf(1 - tail, k + 1, np.maximum(total - k, 1e-12)), 1.0)
    return rate, low, high


def error_free_needed(bar: float, confidence: float) -> int | None:
    """The fewest requests, all error-free, whose exact upper bound is ≤ bar (None: no count can show bar ≤ 0)."""
    if bar <= 0:
        return None
    if bar >= 1:
        return 1
    tail = (1.0 - confidence) / 2.0
    n = math.ceil(math.log(tail) / math.log1p(-bar))
    while n > 1 and 1 - tail ** (1 / (n - 1)) <= bar:  # guard the ceiling against rounding
        n -= 1
    while 1 - tail ** (1 / n) > bar:
        n += 1
    return n


def drift_t(early: np.ndarray, late: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(drift, low, high) with drift = late ÷ early − 1 of per-window statistics (geometric means; Welch)."""
    ratio, low, high = log_ratio(late, early, confidence)
    return ratio - 1.0, low - 1.0, high - 1.0


def quantile_order(sorted_values: np.ndarray, q: float, confidence: float) -> tuple[float, float]:
    """Distribution-free interval of the q-quantile of independent draws: order statistics (l, u) with
    P(X(l) ≤ ξq ≤ X(u)) ≥ confidence (binomial counts of draws below ξq)."""
    x = np.asarray(sorted_values, dtype=np.float64)
    n = len(x)
    if n == 0:
        return math.nan, math.nan
    tail = (1.0 - confidence) / 2.0
    lo = int(stats.binom.ppf(tail, n, q))          # P(B ≤ lo − 1) ≤ tail  → X(lo) (1-based) below ξq
    hi = int(stats.binom.ppf(1 - tail, n, q)) + 1  # P(B ≥ hi) ≤ tail      → X(hi) above ξq
    low = x[lo - 1] if lo >= 1 else -math.inf
    high = x[hi - 1] if hi <= n else math.inf
    return float(low), float(high)


Z95 = 1.959963984540054  # the two-sided 95 % normal quantile: a window's order-statistic interval → its log SE


def quantile_min_requests(q: float, confidence: float = 0.95) -> int:
    """The fewest independent requests whose distribution-free interval of the q-quantile at `confidence` has both
    ends inside the sample (q^n ≤ tail and (1 − q)^n ≤ tail): 36 for p90, 368 for p99, 6 for p50."""
    tail = (1.0 - confidence) / 2.0
    if not 0 < q < 1:
        return 2
    return int(math.ceil(math.log(tail) / math.log(max(q, 1 - q)) - 1e-12))


def quantile_log_se(sorted_values: np.ndarray, q: float) -> float:
    """A window's own sampling error of its q-quantile on the log scale: the distribution-free 95 % interval of the
    quantile (order statistics, `quantile_order`) as log(high ÷ low) ÷ (2 × 1.96); inf when the window holds too few
    requests for that interval (`quantile_min_requests`)."""
    low, high = quantile_order(sorted_values, q, 0.95)
    if not (math.isfinite(low) and math.isfinite(high)) or low <= 0:
        return math.inf
    return math.log(high / low) / (2 * Z95)


def order_indices(n: int, q: float, confidence: float = 0.95) -> tuple[int, int]:
    """The 1-based order statistics (l, u) of `quantile_order` for n draws (l < 1 or u > n: no finite end)."""
    tail = (1.0 - confidence) / 2.0
    return int(stats.binom.ppf(tail, n, q)), int(stats.binom.ppf(1 - tail, n, q)) + 1
