"""Capacity checked at pilot scale (issue 24, item 5): the tier capped below the size the trace's reuse asks for.

The procurement report sizes FX from the LRU curve of the customer's trace: the capacity that captures the plan's
share (`reuse_share`, 0.95) of the reuse the trace allows. That figure rests on the oracle's model of a cache (an
LRU of blocks, docs/traces.md "The counting"). G4 checks the model on the tier itself: it replays the sampled
requests once more with the FX tier capped at the capacity the oracle says captures `fraction` (half) of the
**sample's** reachable reuse (the sample's own curve: scaled to what is replayed), and compares the external-hit
share the server measured (its /metrics) with the oracle's prediction for exactly the capacity configured. The cap
is read off the curve, not a fixed share of the size: a curve that rises in one step (a generated sample whose
sessions all come back after the same distance) would put half the size below the step, predict no hits at all and
make a check that cannot fail; at the capacity that captures half the reuse the prediction is at least half of it.

Pure: the replay CSV's analysis (`gates.traces.analysis`) in, figures out; `runners` renders the cap into LMCache's
`max_local_disk_size` and `gates.judge` compares.
"""
from __future__ import annotations

from typing import Any

from gates.traces.analysis import LITTLE_REUSE, Analysis

DEFAULT_FRACTION = 0.5        # the tier is capped at the capacity that captures half of the reachable reuse
DEFAULT_SHARE = 0.95          # the share of the reachable reuse the capacity is sized for (gates.sizing reuse_share)
DEFAULT_TOLERANCE = 0.05      # |measured − predicted| within 5 points of the prompt tokens: the check passes


def plan(analysis: Analysis, *, share: float = DEFAULT_SHARE, fraction: float = DEFAULT_FRACTION,
         chunk_tokens: int = 256) -> dict[str, Any]:
    """The capped replay's figures for the replayed requests' analysis.

    `capacity_tokens` is the fewest whole blocks of the trace whose LRU captures `fraction` of the sample's
    reachable reuse (rounded up to whole LMCache chunks when a block is not a multiple of a chunk);
    `predicted_hit_fraction` is the oracle's LRU hit share at exactly that capacity; `capacity_for_share_tokens`
    the capacity that captures `share` of it (what the sizing buys). `applicable` is false — with the reason —
    when the reuse is unknown, little (below LITTLE_REUSE of the prompt tokens) or nil, or when the prediction at
    the cap is within two tolerances of nothing (a check that could not fail): such traffic has nothing for a
    capped tier to show, which is the traffic, not an FX failure."""
    out: dict[str, Any] = {"share": share, "fraction": fraction, "applicable": False, "reason": None}
    reuse = analysis.reuse
    if reuse is None:
        out["reason"] = "reuse-unknown"
        return out
    bt = reuse.block_tokens
    total = reuse.input_tokens
    ideal = reuse.ideal_hit_tokens
    out.update(block_tokens=bt, input_tokens=int(total), ideal_hit_tokens=int(ideal),
               ideal_hit_fraction=(ideal / total if total else 0.0), requests=int(reuse.requests))
    if not total or ideal / total < LITTLE_REUSE:
        out["reason"] = "little-reuse"
        return out
    needed = reuse.capacity_for(share)
    if not needed:
        out["reason"] = "little-reuse"
        return out
    blocks = max(1, reuse.capacity_for(fraction) or 1)
    if bt % chunk_tokens:                 # a block that is not whole chunks: the cap in whole chunks (rounded up)
        tokens = -(-blocks * bt // chunk_tokens) * chunk_tokens
        blocks = tokens // bt
    hits = int(reuse.lru_hit_tokens(blocks))
    if hits / total <= 2 * DEFAULT_TOLERANCE:
        out["reason"] = "little-reuse"    # the prediction leaves no room below it to fail in
        return out
    out.update(applicable=True, capacity_for_share_tokens=int(needed * bt), capacity_blocks=int(blocks),
               capacity_tokens=int(blocks * bt), predicted_hit_tokens=hits, predicted_hit_fraction=hits / total)
    return out


def judge(measured: float | None, predicted: float, tolerance: float = DEFAULT_TOLERANCE) -> dict[str, Any]:
    """How close the capped tier came to the oracle: d = measured − predicted (shares of the prompt tokens).

    * pass: |d| ≤ tolerance — the tier holds what a cache of that size should, so the sizing's curve holds;
    * fail: d < −2 × tolerance — the tier served clearly less than a cache of its configured size must (it lost,
      or never kept, what it was given): capacity bought from the curve would under-deliver;
    * marginal: otherwise — between one and two tolerances below, or more than one above (a tier serving more
      than its configured size can hold means the cap did not hold or another cache served; joint review).

    Both figures are counts of tokens over one replay, not samples: the check states them and their difference,
    no interval."""
    if measured is None:
        return {"verdict": "invalid", "difference": None}
    difference = measured - predicted
    if abs(difference) <= tolerance + 1e-12:
        verdict = "pass"
    elif difference < -2 * tolerance - 1e-12:
        verdict = "fail"
    else:
        verdict = "marginal"
    return {"verdict": verdict, "difference": difference}
