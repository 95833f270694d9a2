"""Choosing what G4 replays from a customer's trace, and writing it as fxpilot's replay CSV.

* **Whole sessions**, never "the first N": by `ratio` (a session is in when a hash of its name and the seed
  falls below the ratio — deterministic, spread over the whole trace, so the arrival process keeps its
  shape) or by a time `window` (the sessions whose first request arrives in [start, end) seconds).
* **Time**: the replayed offsets are the trace's offsets from the sample's first request, each idle gap
  (time between consecutive arrivals of the sample) cut to `idle_gap_cap_s`, then divided by `speedup`.
* **Prompts over `max_model_len`** (prompt + output tokens > the deployment's context) are `cut` to fit or
  left `out`; either way they are counted.

The result says what share of the trace's requests it keeps and the replayed request rate against the
trace's, for the reports. The CSV carries every request's `block_ids` (content-addressed blocks: the
workload client builds the same tokens for the same id wherever it appears).
"""
from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gates.traces.analysis import STRATA, Analysis


@dataclass
class Sample:
    """The requests of a trace chosen for replay, in arrival order, with what was done to them."""

    index: np.ndarray                 # file indices of the kept requests, arrival order
    offsets_s: np.ndarray             # replay offsets in seconds (after the gap cap and the speed-up)
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    session: list[str]
    turn: np.ndarray
    blocks: list[np.ndarray]
    stratum: list[str | None]
    stats: dict[str, Any] = field(default_factory=dict)


def session_hash(name: str, seed: int) -> float:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def choose(analysis: Analysis, *, ratio: float | None = None, window: tuple[float, float] | None = None,
           seed: int = 20260629, speedup: float = 1.0, idle_gap_cap_s: float | None = None,
           max_model_len: int | None = None, over_length: str = "cut", max_requests: int | None = None) -> Sample:
    """Whole sessions of the analysed trace, timed and fitted for replay (see the module's description)."""
    if ratio is None and window is None:
        ratio = 1.0
    if ratio is not None and not 0 < ratio <= 1:
        raise ValueError(f"ratio {ratio} must be in (0, 1]")
    if speedup <= 0:
        raise ValueError(f"speed-up {speedup} must be > 0")
    if over_length not in ("cut", "out"):
        raise ValueError(f"over_length {over_length!r}: use cut or out")
    t = analysis.trace
    session = analysis.session
    names = (t.session_names if t.session_names is not None and t.session_basis == "given"
             else [f"s{i:07d}" for i in range(analysis.sessions)])
    order = np.argsort(t.timestamps, kind="stable")
    if window is not None:
        start, end = window
        first_time = np.full(analysis.sessions, np.inf)
        np.minimum.at(first_time, session, t.timestamps)
        keep_session = (first_time >= start) & (first_time < end)
    else:
        keep_session = np.array([session_hash(n, seed) < ratio for n in names], dtype=bool)
    kept = order[keep_session[session[order]]]
    if max_requests is not None and kept.size > max_requests:
        # whole sessions until the budget is spent, in the order of their first arrival
        sessions_in_order = list(dict.fromkeys(session[kept].tolist()))
        sizes = np.bincount(session[kept], minlength=analysis.sessions)
        chosen, total = set(), 0
        for s in sessions_in_order:
            if total + sizes[s] > max_requests and chosen:
                break
            chosen.add(s)
            total += sizes[s]
        kept = kept[np.isin(session[kept], list(chosen))]
    prompt = t.input_tokens[kept].copy()
    output = t.output_tokens[kept].copy()
    too_long = np.zeros(kept.size, dtype=bool)
    cut_count = 0
    if max_model_len:
        too_long = prompt + output > max_model_len
        if over_length == "out":
            kept, prompt, output = kept[~too_long], prompt[~too_long], output[~too_long]
        else:
            cut_count = int(too_long.sum())
            output = np.minimum(output, max(1, max_model_len // 8))
            prompt = np.minimum(prompt, max_model_len - output)
    ts = t.timestamps[kept]
    offsets = np.zeros(kept.size)
    capped = 0
    if kept.size:
        gaps = np.diff(ts)
        if idle_gap_cap_s is not None:
            capped = int((gaps > idle_gap_cap_s).sum())
            gaps = np.minimum(gaps, idle_gap_cap_s)
        offsets[1:] = np.cumsum(gaps)
        offsets /= speedup
    # turn numbers within each kept session, by arrival
    turn = np.zeros(kept.size, dtype=np.int64)
    counter: dict[int, int] = {}
    for i, s in enumerate(session[kept].tolist()):
        counter[s] = counter.get(s, 0) + 1
        turn[i] = counter[s]
    blocks = [t.blocks(i) if t.reuse_known else np.zeros(0, dtype=np.int64) for i in kept.tolist()]
    if max_model_len and t.reuse_known:
        bt = t.block_tokens
        blocks = [b[:-(-int(p) // bt)] for b, p in zip(blocks, prompt, strict=True)]
    stratum = ([STRATA[k] for k in analysis.stratum[kept].tolist()] if analysis.stratum is not None
               else [None] * kept.size)
    trace_duration = float(t.timestamps.max() - t.timestamps.min()) if t.requests else 0.0
    replay_duration = float(offsets[-1]) if kept.size else 0.0
    stats = {
        "trace_requests": t.requests, "trace_sessions": analysis.sessions,
        "sampled_requests": int(kept.size), "sampled_sessions": int(np.unique(session[kept]).size),
        "sampled_share": kept.size / t.requests if t.requests else 0.0,
        "selection": ({"window_s": list(window)} if window is not None else {"ratio": ratio, "seed": seed}),
        "speedup": speedup, "idle_gap_cap_s": idle_gap_cap_s, "idle_gaps_capped": capped,
        "trace_rate_per_s": t.requests / trace_duration if trace_duration > 0 else None,
        "replay_rate_per_s": kept.size / replay_duration if replay_duration > 0 else None,
        "replay_duration_s": replay_duration,
        "max_model_len": max_model_len, "over_length": over_length,
        "over_length_requests": int(too_long.sum()), "cut_requests": cut_count,
        "left_out_requests": int(too_long.sum()) if over_length == "out" else 0,
        "block_tokens": t.block_tokens if t.reuse_known else None,
        "reuse_known": t.reuse_known,
    }
    names_kept = [names[s] for s in session[kept].tolist()]
    return Sample(kept, offsets, prompt, output, names_kept, turn, blocks, stratum, stats)


REPLAY_COLUMNS = ("session_id", "turn", "prompt_tokens", "output_tokens", "arrival_offset_s", "block_ids", "stratum")


def replay_csv(sample: Sample) -> str:
    """fxpilot's replay CSV: one row per request, arrival order, with its block ids and stratum."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(REPLAY_COLUMNS)
    for i in range(sample.index.size):
        writer.writerow([sample.session[i], int(sample.turn[i]), int(sample.prompt_tokens[i]),
                         max(1, int(sample.output_tokens[i])), f"{sample.offsets_s[i]:.6f}",
                         " ".join(str(int(b)) for b in sample.blocks[i]), sample.stratum[i] or ""])
    return out.getvalue()
