"""Coverage of the soak's drift interval (issue 45, item 2), simulated request by request.

    .venv/bin/python benchmarks/calibration/drift.py [--pilots 2000]

Each simulated soak draws every request of every window (not the planner's order-statistic shortcut): a window's
TTFT level scatters log-normally with CV `window_spread`, the late half of the steady windows is shifted by the
true drift, and each window's requests scatter around its level (`shape`: log-normal with log-SD 0.35, or a
heavier right tail: log-normal × an exponential service time). Each window's statistic is taken as the judge
takes it (numpy's quantile of the window's own requests) and the interval is the judge's (intervals.drift_t over
the steady windows, warm-up left out) at 95 %. Coverage = the share of soaks whose interval holds
the true drift; the target is 95 % ± 1.5 points. Writes benchmarks/out/drift-coverage-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gates.judge import intervals  # noqa: E402

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
SETTINGS = [  # statistic, windows (1 warm-up left out), requests per window, window spread, shape
    ("p90", 24, 200, 0.02, "lognormal"),
    ("p90", 24, 50, 0.02, "lognormal"),
    ("p90", 12, 400, 0.06, "lognormal"),
    ("p90", 24, 200, 0.02, "heavy"),
    ("p99", 24, 800, 0.02, "lognormal"),
    ("p50", 24, 100, 0.06, "lognormal"),
    ("p90", 6, 50, 0.02, "lognormal"),
]


def soaks(rng: np.random.Generator, pilots: int, steady: int, n: int, window_spread: float, shape: str,
          drift: float) -> np.ndarray:
    """Sorted TTFTs, pilots × steady windows × n requests."""
    sigma = math.sqrt(math.log1p(window_spread ** 2))
    levels = sigma * rng.standard_normal((pilots, steady, 1))
    levels[:, steady // 2:] += math.log1p(drift)
    x = np.exp(levels + 0.35 * rng.standard_normal((pilots, steady, n)))
    if shape == "heavy":
        x = x * rng.standard_exponential((pilots, steady, n))
    return np.sort(x, axis=-1)


def judged(sorted_x: np.ndarray, statistic: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = QUANTILES[statistic]
    n = sorted_x.shape[-1]
    lo, hi = intervals.order_indices(n, q)
    if lo < 1 or hi > n:
        raise ValueError(f"{n} requests per window cannot estimate a {statistic} (the judge calls it invalid)")
    values = np.quantile(sorted_x, q, axis=-1)
    half = values.shape[-1] // 2
    return intervals.drift_t(values[:, :half], values[:, half:], 0.95)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pilots", type=int, default=2000)
    args = parser.parse_args()
    started = time.time()
    rows, missed = [], []
    for statistic, windows, n, spread, shape in SETTINGS:
        for drift in (0.0, 0.3):
            rng = np.random.default_rng([windows, n, int(spread * 100), len(shape), int(drift * 10)])
            covered, fails, passes, done = 0, 0, 0, 0
            while done < args.pilots:
                batch = min(250, args.pilots - done)
                value, low, high = judged(soaks(rng, batch, windows - 1, n, spread, shape, drift), statistic)
                covered += int(np.sum((low <= drift) & (drift <= high)))
                passes += int(np.sum(high <= 0.20))
                fails += int(np.sum(low > 0.20))
                done += batch
            row = {"statistic": statistic, "windows": windows, "requests_per_window": n, "window_spread": spread,
                   "shape": shape, "true_drift": drift, "pilots": done, "coverage_95": covered / done,
                   "pass_share": passes / done, "fail_share": fails / done}
            rows.append(row)
            if abs(row["coverage_95"] - 0.95) > 0.015 + 2 * math.sqrt(0.95 * 0.05 / done):
                missed.append(row)
            print(f"{statistic} {windows:>2} windows × {n:>4} ({shape:<9}, spread {spread:.2f}) drift {drift:.0%}: "
                  f"coverage {row['coverage_95']:.1%}, pass {row['pass_share']:.1%}, fail {row['fail_share']:.1%}")
    out = ROOT / "benchmarks" / "out"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"drift-coverage-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps({"rows": rows, "seconds": round(time.time() - started, 1)}, indent=1))
    print(f"{time.time() - started:.0f} s; written {path.relative_to(ROOT)}")
    for row in missed:
        print("MISSED (coverage outside 95 % ± 1.5 points):", row)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
