"""The three tiers in front of recompute, as a cascade of LRU caches (issue 43 item 3): vLLM's HBM prefix cache,
LMCache's DRAM, then FX. Pure: a trace's analysis in, per-request and per-stratum shares out.

The model, stated (docs/traces.md, "HBM, DRAM and FX"):

* **HBM** is an LRU cache of `hbm_tokens // block_tokens` blocks over every request's blocks (vLLM keeps a
  running request's blocks and frees them least recently used first): a request's HBM run is its leading blocks
  HBM holds.
* **DRAM** sees what HBM missed: the request's blocks after its HBM run, looked up (its run continues the HBM run)
  and then inserted or refreshed — LMCache stores what vLLM computed or loaded and is not asked for tokens HBM
  served. An LRU of `dram_tokens // block_tokens` blocks.
* **FX** sees what DRAM missed: the blocks after the DRAM run, the same way, unbounded or `fx_tokens`.

Each level's hits are counted as the trace's counting counts them (`gates.traces.reuse`: the run stops at the first
block a level does not hold; hit tokens are `min(run × block_tokens, prompt)` less what the levels above served).
With FX unbounded the three levels serve exactly the trace's ideal reuse (a block seen before is always in FX).
`gates.traces.reference.tiered_hit_tokens` states the same with three `OrderedDict`s; the tests hold the two
to each other on random traces.

Each level's stream is one pass of `gates.traces.reuse.profile` over the blocks the level sees, so every FX
capacity (the curve the sizing reads) comes from that one pass too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gates.traces.analysis import STRATA, Analysis
from gates.traces.reuse import ReuseProfile, arrival_blocks, profile

MODEL = ("cascade of LRU caches: HBM over every request's blocks; DRAM over the blocks HBM missed; FX over the "
         "blocks DRAM missed (each level looks up the run the level above left off, then inserts what it saw)")


@dataclass
class Cascade:
    """Per request (arrival order): tokens served by HBM and DRAM, and the FX level's own reuse profile."""

    block_tokens: int
    hbm_tokens: int
    dram_tokens: int
    input_tokens: np.ndarray      # per request, arrival order
    hbm: np.ndarray
    dram: np.ndarray
    fx_profile: ReuseProfile      # the stream FX sees: every FX capacity's hits come from it
    order: np.ndarray             # arrival order → file index

    def fx(self, fx_tokens: int | None = None) -> np.ndarray:
        """Tokens FX serves per request (arrival order): unbounded, or an LRU of `fx_tokens`."""
        if fx_tokens is None:
            return self.fx_profile.ideal_hits.copy()
        return self.fx_profile.lru_hits_per_request(int(fx_tokens) // self.block_tokens)


def _suffix(offsets: np.ndarray, ids: np.ndarray, skip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each request's blocks after its first `skip` blocks."""
    counts = np.diff(offsets)
    skip = np.minimum(skip, counts)
    keep = counts - skip
    new_offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(keep, out=new_offsets[1:])
    if ids.size == 0:
        return new_offsets, ids
    req = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    position = np.arange(ids.size, dtype=np.int64) - offsets[:-1][req]
    return new_offsets, ids[position >= skip[req]]


def _run_blocks(hits: np.ndarray, block_tokens: int) -> np.ndarray:
    """Blocks in a run from its hit tokens (min(run × block, prompt): exact while a run ends within the prompt)."""
    return -(-hits // block_tokens)


def cascade_arrays(offsets: np.ndarray, ids: np.ndarray, input_tokens: np.ndarray, block_tokens: int,
                   timestamps: np.ndarray, hbm_tokens: int, dram_tokens: int,
                   full: ReuseProfile | None = None) -> Cascade:
    """The cascade over a trace's blocks (file order in; `full`, the profile of the whole stream, when known)."""
    bt = int(block_tokens)
    if full is None:
        full = profile(offsets, ids, input_tokens, bt, timestamps)
    order = full.order
    offsets, ids = arrival_blocks(np.asarray(offsets, dtype=np.int64), np.asarray(ids), order)
    length = np.asarray(input_tokens, dtype=np.int64)[order]
    ts = np.asarray(timestamps, dtype=np.float64)[order]
    hbm_blocks = max(0, int(hbm_tokens)) // bt
    hbm = full.lru_hits_per_request(hbm_blocks) if hbm_blocks else np.zeros(length.size, dtype=np.int64)
    run1 = _run_blocks(hbm, bt)
    off2, ids2 = _suffix(offsets, ids, run1)
    left2 = np.maximum(length - hbm, 0)
    dram_blocks = max(0, int(dram_tokens)) // bt
    if dram_blocks:
        second = profile(off2, ids2, left2, bt, ts)
        dram = second.lru_hits_per_request(dram_blocks)
    else:
        dram = np.zeros(length.size, dtype=np.int64)
    run2 = _run_blocks(dram, bt)
    off3, ids3 = _suffix(off2, ids2, run2)
    left3 = np.maximum(left2 - dram, 0)
    fx_profile = profile(off3, ids3, left3, bt, ts)
    return Cascade(bt, int(hbm_tokens), int(dram_tokens), length, hbm, dram, fx_profile, order)


def cascade(analysis: Analysis, hbm_tokens: int, dram_tokens: int) -> Cascade | None:
    """The cascade over an analysed trace; None when its reuse is unknown."""
    t = analysis.trace
    if analysis.reuse is None:
        return None
    return cascade_arrays(t.block_offsets, t.block_ids, t.input_tokens, t.block_tokens, t.timestamps, hbm_tokens,
                          dram_tokens, full=analysis.reuse)


def shares(c: Cascade, fx_tokens: int | None = None, stratum: np.ndarray | None = None) -> dict[str, Any]:
    """Prompt tokens served by HBM, DRAM and FX (and recomputed), overall and per stratum (`stratum`: int8 per
    request in arrival order, index into STRATA), as tokens and shares of the prompt tokens."""
    fx = c.fx(fx_tokens)

    def row(mask: np.ndarray | None) -> dict[str, Any]:
        pick = slice(None) if mask is None else mask
        total = int(c.input_tokens[pick].sum())
        served = {"hbm": int(c.hbm[pick].sum()), "dram": int(c.dram[pick].sum()), "fx": int(fx[pick].sum())}
        served["recompute"] = total - sum(served.values())
        out: dict[str, Any] = {"requests": int(c.input_tokens[pick].size), "input_tokens": total,
                               "tokens": served}
        out["share"] = {k: (v / total if total else 0.0) for k, v in served.items()}
        return out

    result: dict[str, Any] = {"model": MODEL, "block_tokens": c.block_tokens, "hbm_tokens": c.hbm_tokens,
                              "dram_tokens": c.dram_tokens, "fx_tokens": None if fx_tokens is None else int(fx_tokens),
                              "overall": row(None), "strata": {}}
    if stratum is not None:
        for i, name in enumerate(STRATA):
            mask = stratum == i
            if mask.any():
                result["strata"][name] = row(mask)
    return result


def report(analysis: Analysis, hbm_tokens: int, dram_tokens: int, fx_tokens: int | None = None,
           share_points: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95, 0.99)) -> dict[str, Any] | None:
    """The tier shares of an analysed trace, with the FX capacity that captures each share of the reuse DRAM lets
    through (the FX stream's own curve: what the sizing buys with HBM and DRAM in front)."""
    c = cascade(analysis, hbm_tokens, dram_tokens)
    if c is None:
        return None
    stratum = analysis.stratum[c.order] if analysis.stratum is not None else None
    out = shares(c, fx_tokens, stratum)
    bt = c.block_tokens
    out["fx_ideal_hit_tokens"] = int(c.fx_profile.ideal_hit_tokens)
    out["fx_capacity_for_share"] = {str(s): (None if (b := c.fx_profile.capacity_for(s)) is None else b * bt)
                                    for s in share_points}
    return out
