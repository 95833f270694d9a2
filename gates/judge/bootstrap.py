"""Point statistics of one sample: numpy's linear quantile (like `vllm bench serve`), the mean, the CV.

The module keeps its name from judge version 1, whose intervals were a vectorised percentile bootstrap. Since
judge version 2 the intervals come from gates/judge/intervals.py (t over repetitions, exact bounds; docs/judge.md
says why: a percentile bootstrap over 3–10 correlated repetitions covered only about 80 % where it said 95 %), and
the resampling code, used by nothing but a benchmark of its own speed, is gone.
"""
from __future__ import annotations

import math

import numpy as np

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "min": 0.0, "max": 1.0}


def point(values: np.ndarray, statistic: str) -> float:
    """The statistic of one sample (sorted or not); numpy's linear quantile, like vllm bench serve."""
    if len(values) == 0:
        return math.nan
    if statistic in QUANTILES:
        return float(np.quantile(values, QUANTILES[statistic]))
    if statistic in ("mean", "value"):
        return float(np.mean(values))
    if statistic == "cv":
        return cv(values)
    raise ValueError(f"unknown statistic {statistic!r}")


def cv(values: np.ndarray) -> float:
    """Coefficient of variation: sample standard deviation (n − 1) over the mean."""
    if len(values) < 2:
        return math.nan
    mean = float(np.mean(values))
    return float(np.std(values, ddof=1) / mean) if mean else math.nan
