"""A trace's analysis as `manage.py trace analyze --json` prints it and the portal shows it.

Sessions, strata and the reuse profile come from one pass (`gates.traces.reuse`). Strata, for judging where a
tier can help: **returning** turns (a session's later requests), **shared_prefix** first turns (a session's
first request whose leading blocks another session already used: system prompts, tools, documents) and
**first** turns with nothing to reuse.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gates.traces.formats import Trace
from gates.traces.reuse import ReuseProfile, profile

LITTLE_REUSE = 0.10          # below this ideal hit share the traffic "has little reuse" (said in every report)
SHARES = (0.5, 0.8, 0.9, 0.95, 0.99)
STRATA = ("first", "shared_prefix", "returning")


@dataclass
class Analysis:
    trace: Trace
    reuse: ReuseProfile | None
    session: np.ndarray            # int64 per request (file order)
    stratum: np.ndarray | None     # int8 per request (file order): index into STRATA; None without reuse

    @property
    def sessions(self) -> int:
        return int(self.session.max()) + 1 if self.session.size else 0


def analyse(trace: Trace) -> Analysis:
    """Sessions (given or inferred), the reuse profile and each request's stratum."""
    reuse = None
    if trace.reuse_known:
        reuse = profile(trace.block_offsets, trace.block_ids, trace.input_tokens, trace.block_tokens,
                        trace.timestamps)
    session = trace.session
    if session is None:
        if reuse is not None:
            session = infer_sessions(trace, reuse)
            trace.session_basis = "inferred"
        else:
            session = np.arange(trace.requests, dtype=np.int64)
            trace.session_basis = "each-request"
    stratum = None
    if reuse is not None:
        stratum = strata(session, reuse)
    return Analysis(trace, reuse, session, stratum)


def infer_sessions(trace: Trace, reuse: ReuseProfile) -> np.ndarray:
    """Session index per request (file order), inferred from block reuse (docs/traces.md, "Sessions inferred").

    A request continues the session of the request that last held the end of its leading run of seen blocks,
    when that run is ≥ 2 blocks and covers every full block of that request.
    """
    order = reuse.order
    R = order.size
    holder = reuse.last_holder
    length = trace.input_tokens[order]
    full = length // trace.block_tokens
    parent = np.where((holder >= 0) & (reuse.run_blocks >= 2) & (reuse.run_blocks >= full[np.maximum(holder, 0)]),
                      holder, np.arange(R))
    root = parent.copy()
    while True:
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    _, dense = np.unique(root, return_inverse=True)
    session = np.empty(R, dtype=np.int64)
    session[order] = dense.reshape(-1)
    return session


def strata(session: np.ndarray, reuse: ReuseProfile) -> np.ndarray:
    """Each request's stratum (file order): 0 first, 1 shared_prefix, 2 returning."""
    order = reuse.order
    arrival_session = session[order]
    seen_before = np.zeros(order.size, dtype=bool)
    _, first_index = np.unique(arrival_session, return_index=True)
    seen_before[:] = True
    seen_before[first_index] = False
    kind = np.where(seen_before, 2, np.where(reuse.run_blocks > 0, 1, 0)).astype(np.int8)
    out = np.empty(order.size, dtype=np.int8)
    out[order] = kind
    return out


def session_final_lengths(analysis: Analysis) -> list[int]:
    """Each session's final context: its last request's input + output tokens (for the session-length sizing)."""
    t = analysis.trace
    order = t.arrival_order()
    last = np.full(analysis.sessions, -1, dtype=np.int64)
    last[analysis.session[order]] = order          # the last assignment wins: the latest arrival
    return (t.input_tokens[last] + t.output_tokens[last]).tolist()


def _quantiles(values: np.ndarray) -> dict[str, Any]:
    if values.size == 0:
        return {}
    ordered = np.sort(values)

    def q(p):   # nearest rank: a length that occurred
        return int(ordered[min(ordered.size - 1, max(0, math.ceil(p * ordered.size) - 1))])
    return {"mean": float(ordered.mean()), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": int(ordered[-1]),
            "min": int(ordered[0])}


def _histogram(values: np.ndarray, edges: list[float], weights: np.ndarray | None = None) -> list[list]:
    counts, _ = np.histogram(values, bins=[-np.inf, *edges, np.inf], weights=weights)
    labels = [*edges, None]
    return [[labels[i], int(c) if weights is None else float(c)] for i, c in enumerate(counts)]


LENGTH_EDGES = [1024, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
REUSE_TIME_EDGES = [1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600]


def report(analysis: Analysis, capacities: tuple[int, ...] = ()) -> dict[str, Any]:
    """The JSON of `trace analyze` (issue 24's fields and more for the portal's charts)."""
    t = analysis.trace
    ts = t.timestamps
    duration = float(ts.max() - ts.min()) if ts.size else 0.0
    out: dict[str, Any] = {
        "format": t.format, "format_name": t.format_name, "file": t.name,
        "requests": t.requests, "sessions": analysis.sessions, "sessions_basis": t.session_basis,
        "input_tokens": int(t.input_tokens.sum()), "output_tokens": int(t.output_tokens.sum()),
        "duration_s": duration, "request_rate_per_s": (t.requests / duration) if duration > 0 else None,
        "input_length": _quantiles(t.input_tokens),
        "input_length_histogram": _histogram(t.input_tokens, LENGTH_EDGES),
        "arrivals": _arrivals(ts),
        # doubts about the file that did not stop it being read (out-of-order times, an inferred block size, prompt
        # lengths estimated from text…): each with its line and field, and a template + values for translation
        "warnings": list(t.warnings),
    }
    out["reuse"] = reuse_report(analysis, capacities)
    return out


def _arrivals(ts: np.ndarray, buckets: int = 48) -> dict[str, Any]:
    if ts.size == 0:
        return {"bucket_s": 0, "counts": []}
    start, end = float(ts.min()), float(ts.max())
    width = max((end - start) / buckets, 1e-9)
    counts = np.bincount(np.minimum(((ts - start) / width).astype(np.int64), buckets - 1), minlength=buckets)
    return {"bucket_s": width, "counts": [int(c) for c in counts]}


def reuse_report(analysis: Analysis, capacities: tuple[int, ...] = ()) -> dict[str, Any]:
    t, reuse = analysis.trace, analysis.reuse
    if reuse is None:
        return {"known": False, "reason": t.reuse_reason, "block_tokens": None, "ideal_hit_fraction": None,
                "lru": [], "summary": "reuse unknown: " + t.reuse_reason}
    bt = reuse.block_tokens
    total = reuse.input_tokens
    def frac(hits):
        return (hits / total if total else 0.0)
    ideal = reuse.ideal_hit_tokens
    lru = []
    for capacity in capacities:
        hits = reuse.lru_hit_tokens(capacity // bt)
        lru.append({"capacity_tokens": int(capacity), "capacity_blocks": int(capacity // bt),
                    "hit_tokens": int(hits), "hit_fraction": frac(hits)})
    strata_report = {}
    kinds = analysis.stratum[reuse.order]
    arrival_input = t.input_tokens[reuse.order]
    for i, name in enumerate(STRATA):
        mask = kinds == i
        strata_report[name] = {"requests": int(mask.sum()), "input_tokens": int(arrival_input[mask].sum()),
                               "ideal_hit_tokens": int(reuse.ideal_hits[mask].sum())}
    little = frac(ideal) < LITTLE_REUSE
    summary = (f"this traffic has little reuse: at most {100 * frac(ideal):.1f} % of its prompt tokens could ever "
               f"come from a cache, so a cache tier cannot change much for it" if little else
               f"{100 * frac(ideal):.1f} % of the prompt tokens could come from a cache of unbounded size")
    return {
        "known": True, "basis": t.reuse_basis, "block_tokens": bt, "block_tokens_basis": t.block_tokens_basis,
        "ideal_hit_fraction": frac(ideal), "ideal_hit_tokens": int(ideal),
        "lru": lru, "little": little, "summary": summary,
        "curve": [{"capacity_tokens": c["capacity_blocks"] * bt, "hit_fraction": frac(c["hit_tokens"])}
                  for c in reuse.curve()],
        "capacity_for_share": {str(s): (None if (c := reuse.capacity_for(s)) is None else c * bt) for s in SHARES},
        "strata": strata_report,
        "reuse_time_histogram": _histogram(reuse.reuse_seconds, REUSE_TIME_EDGES,
                                           weights=reuse.rec_tokens.astype(np.float64)),
    }
