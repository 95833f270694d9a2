"""Before any GPU time: what a trace's reuse predicts for the pilot (issue 24, item 7). Pure arithmetic.

The prediction is stated as a prediction, with its basis, never as a measurement:

    captured   = the trace's ideal hit share × the share of that reuse the sized tier captures (reuse_share)
    full hit   = recompute TTFT ÷ FX TTFT in the plan's published reference (Table 1) at the pilot's concurrency,
                 or at the nearest level where both are published (Table 1 gives recompute at 16 only)
    speed-up   = 1 ÷ ((1 − captured) + captured ÷ full hit)

i.e. Amdahl's rule on prefill work: the captured prompt tokens come from the tier as fast as Table 1's
cold-recovery requests did, the rest is recomputed. It is the gain of the traffic's prefill work as a whole,
not of its median request (G4's bar is TTFT p50 over every replayed request: when fewer than half the requests
can hit, the median is a cold request whatever the tier does — docs/traces.md). A trace whose reuse is unknown
predicts nothing; one with little reuse predicts little, and says that it is the traffic.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def _levels(arm: Mapping | None) -> dict[int, float]:
    out = {}
    for level, figures in (arm or {}).items():
        try:
            ttft = float(figures[0])
            out[int(level)] = ttft
        except (TypeError, ValueError, IndexError, KeyError):
            continue
    return {k: v for k, v in out.items() if v > 0}


def full_hit_speedup(reference: Mapping[str, Any] | None, concurrency: int) -> tuple[float, int] | None:
    """(recompute TTFT ÷ FX TTFT, the level it was read at): the pilot's concurrency when both arms are
    published there, else the nearest such level on a log scale (ties: the lower). None without both arms."""
    fx, recompute = _levels((reference or {}).get("fx")), _levels((reference or {}).get("recompute"))
    common = sorted(set(fx) & set(recompute))
    if not common:
        return None
    level = min(common, key=lambda c: (abs(math.log2(c) - math.log2(max(1, concurrency))), c))
    return recompute[level] / fx[level], level


def predicted_gain(reuse: Mapping[str, Any] | None, reference: Mapping[str, Any] | None, concurrency: int, *,
                   share: float = 0.95, bar: float | None = None) -> dict[str, Any] | None:
    """The predicted TTFT speed-up against full recompute of this traffic's prefill work at the pilot's
    concurrency, with what it rests on; None when the trace's reuse is unknown or nothing is published."""
    if not reuse or not reuse.get("known") or reuse.get("ideal_hit_fraction") is None:
        return None
    found = full_hit_speedup(reference, concurrency)
    if found is None:
        return None
    full, level = found
    captured = float(reuse["ideal_hit_fraction"]) * share
    speedup = 1.0 / ((1.0 - captured) + captured / full)
    return {"concurrency": int(concurrency), "level": level, "at_concurrency": level == int(concurrency),
            "full_hit_speedup": full, "ideal_hit_fraction": float(reuse["ideal_hit_fraction"]), "share": share,
            "captured_hit_fraction": captured, "speedup": speedup, "little": bool(reuse.get("little")),
            "bar": bar, "meets_bar": None if bar is None else speedup >= bar}
