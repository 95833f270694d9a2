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

import numpy as np

from gates.traces import tiers
from gates.traces.analysis import LITTLE_REUSE, Analysis

DEFAULT_FRACTION = 0.5        # the tier is capped at the capacity that captures half of the reachable reuse
DEFAULT_SHARE = 0.95          # the share of the reachable reuse the capacity is sized for (gates.sizing reuse_share)
DEFAULT_TOLERANCE = 0.05      # |measured − predicted| within 5 points of the prompt tokens: the check passes
DEFAULT_ORDER_TOLERANCE = 0.01   # at most 1 % of the request pairs sent in another order than the oracle's


def plan(analysis: Analysis, *, share: float = DEFAULT_SHARE, fraction: float = DEFAULT_FRACTION,
         chunk_tokens: int = 256, dram_tokens: int = 0) -> dict[str, Any]:
    """The capped replay's figures for the replayed requests' analysis.

    The capped replay runs with vLLM's prefix cache off and LMCache's DRAM (`dram_tokens`, the deployment's DRAM
    size in tokens) in front of the capped FX tier: FX sees what DRAM misses (gates.traces.tiers). `capacity_tokens`
    is the fewest whole blocks whose LRU captures `fraction` of the reuse the FX stream allows (rounded up to whole
    LMCache chunks when a block is not a multiple of a chunk); `predicted_hit_fraction` the external-hit share (DRAM
    + FX, what LMCache's hit counter counts) the cascade predicts at exactly that cap, `predicted_fx_hit_fraction`
    and `predicted_dram_hit_fraction` its two parts; `capacity_for_share_tokens` the FX capacity that captures
    `share` of the FX stream's reuse (what the sizing buys, at the sample's scale). `applicable` is false — with the
    reason — when the reuse is unknown, little (below LITTLE_REUSE of the prompt tokens) or nil, when DRAM holds the
    sample's reuse (`dram-holds-reuse`: nothing reaches FX), or when the prediction at the cap is within two
    tolerances of nothing (a check that could not fail): such traffic has nothing for a capped tier to show, which
    is the traffic (or the sample), not an FX failure."""
    out: dict[str, Any] = {"share": share, "fraction": fraction, "applicable": False, "reason": None,
                           "dram_tokens": int(dram_tokens), "hbm_tokens": 0, "model": tiers.MODEL}
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
    c = tiers.cascade(analysis, 0, dram_tokens)
    fx_stream = c.fx_profile
    dram = int(c.dram.sum())
    out.update(fx_ideal_hit_tokens=int(fx_stream.ideal_hit_tokens), predicted_dram_hit_tokens=dram,
               predicted_dram_hit_fraction=dram / total)
    needed = fx_stream.capacity_for(share)
    if not needed or fx_stream.ideal_hit_tokens / total < LITTLE_REUSE:
        out["reason"] = "dram-holds-reuse" if dram_tokens and dram else "little-reuse"
        return out
    blocks = max(1, fx_stream.capacity_for(fraction) or 1)
    if bt % chunk_tokens:                 # a block that is not whole chunks: the cap in whole chunks (rounded up)
        tokens = -(-blocks * bt // chunk_tokens) * chunk_tokens
        blocks = tokens // bt
    fx_hits = int(fx_stream.lru_hit_tokens(blocks))
    if fx_hits / total <= 2 * DEFAULT_TOLERANCE:
        out["reason"] = "dram-holds-reuse" if dram_tokens and dram else "little-reuse"
        return out
    out.update(applicable=True, capacity_for_share_tokens=int(needed * bt), capacity_blocks=int(blocks),
               capacity_tokens=int(blocks * bt), predicted_fx_hit_tokens=fx_hits,
               predicted_fx_hit_fraction=fx_hits / total, predicted_hit_tokens=fx_hits + dram,
               predicted_hit_fraction=(fx_hits + dram) / total)
    return out


def rows(sample_session: list[str], turn, prompt_tokens, blocks) -> dict[str, list]:
    """The replayed requests in the oracle's order, compact, for the judge to recompute the oracle on the order the
    capped replay's records show (`in_order`): session, turn, prompt tokens, block ids (space-separated)."""
    return {"session": [str(s) for s in sample_session], "turn": [int(t) for t in turn],
            "prompt_tokens": [int(p) for p in prompt_tokens],
            "blocks": [" ".join(str(int(b)) for b in bl) for bl in blocks]}


def _inversions(sequence: list[int]) -> tuple[int, tuple[int, int] | None]:
    """Pairs i < j with sequence[i] > sequence[j] (a Fenwick tree), and the first such pair by j."""
    n = max(sequence, default=-1) + 2
    tree = [0] * (n + 1)
    count, first = 0, None
    seen = 0
    biggest = -1
    for value in sequence:
        i, below = value + 1, 0
        while i > 0:
            below += tree[i]
            i -= i & -i
        above = seen - below
        if above and first is None:
            first = (biggest, value)
        count += above
        i = value + 1
        while i <= n:
            tree[i] += 1
            i += i & -i
        seen += 1
        biggest = max(biggest, value)
    return count, first


def in_order(check: dict[str, Any], sent: list[tuple[str, int]], *, order_tolerance: float | None = None) -> dict:
    """The oracle recomputed on the order the capped replay's records show (`sent`: (session, turn) in the order
    sent), against the oracle's own order (its `rows`): how many request pairs were sent the other way round, the
    first such pair, requests the records name that the oracle lacks (and the reverse), and the prediction at the
    cap for the order sent. `faithful` is false when the order differs beyond `order_tolerance` (a share of the
    pairs) or a request does not match: the check then measured other traffic than the one it predicted."""
    data = check.get("rows") or {}
    tolerance = float(check.get("order_tolerance", DEFAULT_ORDER_TOLERANCE) if order_tolerance is None
                      else order_tolerance)
    index = {(s, int(t)): i for i, (s, t) in enumerate(zip(data.get("session", []), data.get("turn", []),
                                                              strict=True))}
    positions, unknown = [], []
    for session, turn in sent:
        i = index.get((str(session), int(turn)))
        if i is None:
            unknown.append(f"{session}/{turn}")
        else:
            positions.append(i)
    missing = len(index) - len(set(positions))
    inverted, first = _inversions(positions)
    n = len(positions)
    pairs = n * (n - 1) // 2
    share = inverted / pairs if pairs else 0.0
    out: dict[str, Any] = {"requests": len(sent), "matched": n, "unknown": unknown[:5], "unknown_count": len(unknown),
                           "missing": missing, "inverted_pairs": inverted, "pairs": pairs, "inverted_share": share,
                           "order_tolerance": tolerance,
                           "first_inversion": None if first is None else [
                               f"{data['session'][first[0]]}/{data['turn'][first[0]]}",
                               f"{data['session'][first[1]]}/{data['turn'][first[1]]}"]}
    out["faithful"] = bool(not unknown and share <= tolerance + 1e-12)
    if n and check.get("applicable"):
        bt = int(check["block_tokens"])
        counts = [len(data["blocks"][i].split()) for i in positions]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.asarray(counts, dtype=np.int64), out=offsets[1:])
        ids = np.array([int(b) for i in positions for b in data["blocks"][i].split()], dtype=np.int64)
        prompt = np.array([data["prompt_tokens"][i] for i in positions], dtype=np.int64)
        c = tiers.cascade_arrays(offsets, ids, prompt, bt, np.arange(n, dtype=np.float64), 0,
                                 int(check.get("dram_tokens") or 0))
        total = int(prompt.sum())
        hits = int(c.dram.sum()) + int(c.fx(int(check["capacity_tokens"])).sum())
        out.update(predicted_in_order=hits / total if total else 0.0, input_tokens=total)
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
