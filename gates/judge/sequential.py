"""Planned looks with a group-sequential boundary (docs/judge.md, "Planned looks").

A gate's cells are measured in repetitions; the plan names the repetition counts at which the judge may
look (`judging.looks`, default 8, 12, 16, 20, 24 of the default plan's 24). At look k the judge asks every
cell's interval at the nominal level of that look: a cell passes when the whole interval clears its bar,
fails when none of it does. The nominal levels come from a Lan–DeMets alpha-spending function of the
O'Brien–Fleming type,

    α(t) = 2 · (1 − Φ(z_{1−α/2} / √t)),     t = repetitions at the look ÷ repetitions at the last look,

with α the one-sided error of one side of the plan's two-sided confidence (0.025 for 95 %): the chance
that a cell whose truth sits exactly at its bar crosses the pass boundary at *any* look is α(1) = α. The
boundary b_k of look k solves P(no crossing before k, crossing at k) = α(t_k) − α(t_{k−1}) for the
Brownian motion of the cell's standardised statistic (recursive numerical integration, Armitage–McPherson–
Rowe; Jennison & Turnbull 2000, ch. 19). The judge turns b_k into the two-sided level 1 − 2(1 − Φ(b_k)) of
its interval functions (t, χ², exact binomial…): the nominal-level approach, whose measured error is in
benchmarks/README.md. Computing the boundary ignores stopping for failure, which can only lower the chance
of a false pass.

A gate's runs share the budget (docs/judge.md, "One error budget per gate"): run r of at most
`judging.runs` gets α_r (the first run 1 − `judging.rerun_alpha_share` of α, the others the rest in equal
parts); within a run its looks spend α_r as above. By Bonferroni the chance that any look of any run
passes a cell at its bar stays ≤ α.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from gates.judge.lazy import optimize, stats

DEFAULT_LOOK_FRACTIONS = (1 / 3, 1 / 2, 2 / 3, 5 / 6, 1.0)
DEFAULT_RUNS = 2
DEFAULT_RERUN_SHARE = 0.2
_GRID = 401


def default_looks(planned: int) -> tuple[int, ...]:
    """Looks of a plan that names none: 1/3, 1/2, 2/3, 5/6 and all of the planned repetitions (24 → 8, 12, 16,
    20, 24), each at least 2 repetitions (an interval over repetitions needs two); one repetition → (1,)."""
    planned = max(int(planned), 1)
    if planned < 2:
        return (1,)
    return tuple(sorted({max(2, round(planned * f)) for f in DEFAULT_LOOK_FRACTIONS} | {planned}))


def spending(t: float, alpha: float) -> float:
    """The O'Brien–Fleming-type spending function: error spent by information fraction t (0 < t ≤ 1)."""
    if t <= 0:
        return 0.0
    z = stats.norm.ppf(1 - alpha / 2)
    return float(2 * (1 - stats.norm.cdf(z / math.sqrt(min(t, 1.0)))))


@lru_cache(maxsize=256)
def boundaries(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """Upper boundaries b_1…b_K on the Z scale for looks at information fractions `fractions` (ascending,
    last 1), one-sided error `alpha` spent with `spending`."""
    out: list[float] = []
    grid = density = None
    previous_t, spent = 0.0, 0.0
    for t in fractions:
        target = spending(t, alpha) - spent
        if grid is None:
            b = float(stats.norm.isf(max(target, 1e-15)))
            sd = math.sqrt(t)
            grid = np.linspace(-8 * sd, b * sd, _GRID)
            density = stats.norm.pdf(grid, scale=sd)
        else:
            step = math.sqrt(t - previous_t)
            weights = _trapezoid(grid) * density

            def crossing(b: float, t=t, step=step, weights=weights, grid=grid) -> float:
                return float(np.sum(weights * stats.norm.sf((b * math.sqrt(t) - grid) / step)))

            if target <= 1e-15:
                b = 12.0
            else:
                b = float(optimize.brentq(lambda x, target=target: crossing(x) - target, -2.0, 40.0, xtol=1e-10))
            top = b * math.sqrt(t)
            new_grid = np.linspace(min(grid[0], -8 * math.sqrt(t)), top, _GRID)
            density = (stats.norm.pdf((new_grid[:, None] - grid[None, :]) / step) @ weights) / step
            grid = new_grid
        spent += target
        out.append(b)
        previous_t = t
    return tuple(out)


def _trapezoid(grid: np.ndarray) -> np.ndarray:
    w = np.empty_like(grid)
    h = np.diff(grid)
    w[0], w[-1] = h[0] / 2, h[-1] / 2
    w[1:-1] = (h[:-1] + h[1:]) / 2
    return w


def run_alpha(alpha: float, run: int, runs: int, rerun_share: float) -> float:
    """One-sided error of run `run` (1-based) of at most `runs` (Bonferroni over a gate's runs)."""
    if runs <= 1 or rerun_share <= 0:
        return alpha if run == 1 else 0.0
    return alpha * (1 - rerun_share) if run == 1 else alpha * rerun_share / (runs - 1)


def nominal_levels(looks: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    """The two-sided confidence of the interval at each look (1 − 2 × the look's nominal one-sided error)."""
    last = looks[-1]
    bs = boundaries(tuple(r / last for r in looks), round(alpha, 12))
    return tuple(1 - 2 * float(stats.norm.sf(b)) for b in bs)


def look_index(looks: tuple[int, ...], repetitions: int) -> int:
    """The last look (1-based) whose repetitions the records reach; 0 when they reach none."""
    reached = [i for i, r in enumerate(looks, start=1) if repetitions >= r]
    return reached[-1] if reached else 0


def spent(looks: tuple[int, ...], look: int, alpha: float) -> float:
    """Error spent by the end of look `look` of a run whose share is alpha."""
    if look <= 0:
        return 0.0
    return spending(looks[look - 1] / looks[-1], alpha)
