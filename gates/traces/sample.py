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
from gates.traces.reuse import profile


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


def shared_sources(analysis: Analysis, keep_session: np.ndarray) -> np.ndarray:
    """The sessions to add so that the sample keeps the sharing across sessions the trace has: for each kept
    session's first request that reuses another session's prefix in the trace (stratum shared_prefix) but would
    reuse less of it among the kept requests alone, the session whose request last held the end of that prefix
    (one level: an added session's own sources are not pulled in). A system prompt some kept session already
    brings pulls in nothing more."""
    reuse = analysis.reuse
    if reuse is None or analysis.stratum is None:
        return np.zeros(0, dtype=np.int64)
    t = analysis.trace
    order = reuse.order
    arrival_session = analysis.session[order]
    kept = np.flatnonzero(keep_session[arrival_session])
    wanted = (analysis.stratum[order][kept] == 1) & (reuse.last_holder[kept] >= 0)
    if not wanted.any():
        return np.zeros(0, dtype=np.int64)
    offsets, ids = subset_blocks(np.asarray(t.block_offsets, dtype=np.int64), t.block_ids, order[kept])
    own = profile(offsets, ids, t.input_tokens[order[kept]], reuse.block_tokens, t.timestamps[order[kept]])
    short = wanted & (own.run_blocks < reuse.run_blocks[kept])
    sources = np.unique(arrival_session[reuse.last_holder[kept[short]]])
    return sources[~keep_session[sources]]


def subset_blocks(offsets: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and ids of the requests `rows` (file indices), in that order."""
    counts = np.diff(offsets)[rows]
    new_offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(counts, out=new_offsets[1:])
    shift = np.repeat(offsets[:-1][rows] - new_offsets[:-1], counts)
    return new_offsets, ids[np.arange(int(new_offsets[-1]), dtype=np.int64) + shift]


def cross_session_blocks(session: np.ndarray, offsets: np.ndarray, ids: np.ndarray) -> int:
    """Distinct blocks that two or more sessions use (the sharing across sessions)."""
    counts = np.diff(offsets)
    if ids.size == 0:
        return 0
    owner = np.repeat(np.asarray(session, dtype=np.int64), counts)
    _, block = np.unique(ids, return_inverse=True)
    pairs = np.unique(block.reshape(-1).astype(np.int64) * (int(owner.max()) + 1) + owner)
    per_block = np.bincount(pairs // (int(owner.max()) + 1))
    return int((per_block >= 2).sum())


def choose(analysis: Analysis, *, ratio: float | None = None, window: tuple[float, float] | None = None,
           seed: int = 20260629, speedup: float = 1.0, idle_gap_cap_s: float | None = None,
           max_model_len: int | None = None, over_length: str = "cut", max_requests: int | None = None,
           keep_shared: bool = False) -> Sample:
    """Whole sessions of the analysed trace, timed and fitted for replay (see the module's description); with
    `keep_shared`, also the sessions that brought in the shared prefixes the chosen ones reuse."""
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
    added = 0
    if keep_shared:
        sources = shared_sources(analysis, keep_session)
        keep_session[sources] = True
        added = int(sources.size)
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
        "shared_sources_added": added,
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


def sample_arrays(sample: Sample) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(block offsets, block ids, prompt tokens, times) of a sample, in its (arrival) order."""
    counts = np.array([b.size for b in sample.blocks], dtype=np.int64)
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    ids = (np.concatenate([np.asarray(b, dtype=np.int64) for b in sample.blocks]) if sample.blocks
           else np.zeros(0, dtype=np.int64))
    return offsets, ids, sample.prompt_tokens.astype(np.int64), sample.offsets_s.astype(np.float64)


def working_set(sample: Sample, block_tokens: int, share: float) -> int:
    """The fewest tokens an LRU cache needs to serve `share` of the sample's own reuse (0 when nothing is reused)."""
    offsets, ids, prompt, ts = sample_arrays(sample)
    if ids.size == 0:
        return 0
    found = profile(offsets, ids, prompt, block_tokens, ts).capacity_for(share)
    return int(found or 0) * block_tokens


def gpu_hours(duration_s: float, gpus: int = 1, replays: int = 1) -> float:
    """GPU-hours a replay of `duration_s` seconds costs on `gpus` GPUs, `replays` times (arms × repetitions)."""
    return duration_s / 3600.0 * max(1, gpus) * max(1, replays)


def size_for_tier(analysis: Analysis, hbm_tokens: int | None, dram_tokens: int | None, *, share: float = 0.95,
                  ratio: float | None = None, max_requests: int | None = None, max_gpu_hours: float | None = None,
                  gpus: int = 1, replays: int = 1, **timing: Any) -> tuple[Sample, dict[str, Any]]:
    """The smallest sample of whole sessions (with the shared prefixes they reuse) whose working set exceeds what
    sits above FX (HBM + DRAM), so that its reuse can only be served by FX — within the budget (`max_requests`,
    `max_gpu_hours` at `gpus` GPUs × `replays` replays). Starts from the ratio the trace's own capacity curve
    suggests (HBM + DRAM ÷ the trace's working set, × 1.25; never below `ratio`) and grows it until the sample's
    own working set is large enough, the budget is spent or the whole trace is taken. When no affordable sample
    can, `needs_tier` is false and `reason` says why with the numbers (the sample is then the last one tried).
    `timing` is passed on to `choose` (seed, speedup, idle_gap_cap_s, max_model_len, over_length)."""
    reuse = analysis.reuse
    above = int(hbm_tokens or 0) + int(dram_tokens or 0)
    sizing: dict[str, Any] = {"hbm_tokens": hbm_tokens, "dram_tokens": dram_tokens, "above_fx_tokens": above,
                              "working_set_share": share, "gpus": gpus, "replays": replays,
                              "max_requests": max_requests, "max_gpu_hours": max_gpu_hours, "attempts": []}
    if reuse is None or not (hbm_tokens or dram_tokens):
        sample = choose(analysis, ratio=ratio, **timing)
        sizing.update(needs_tier=None, reason=("reuse unknown: no working set to size from" if reuse is None else
                                               "the HBM and DRAM sizes are not known: the plan's sample is replayed"))
        return sample, _finish(sample, sizing, gpus, replays)
    bt = reuse.block_tokens
    trace_ws = int(reuse.capacity_for(share) or 0) * bt
    sizing["trace_working_set_tokens"] = trace_ws
    if trace_ws <= above:
        sample = choose(analysis, ratio=ratio, keep_shared=True, **timing)
        sizing.update(needs_tier=False, working_set_tokens=working_set(sample, bt, share),
                      reason=(f"the whole trace's working set ({trace_ws:,} tokens for {100 * share:g} % of its "
                              f"reuse) fits in HBM + DRAM ({above:,} tokens): this traffic does not need the tier "
                              f"at this deployment's size"))
        return sample, _finish(sample, sizing, gpus, replays)
    r = min(1.0, max(float(ratio or 0.0), above / trace_ws * 1.25, 1e-6))
    sample, ws = None, 0
    for _ in range(12):
        sample = choose(analysis, ratio=r, keep_shared=True, **timing)
        ws = working_set(sample, bt, share)
        hours = gpu_hours(float(sample.stats["replay_duration_s"]), gpus, replays)
        sizing["attempts"].append({"ratio": r, "requests": int(sample.index.size), "working_set_tokens": ws,
                                   "gpu_hours": hours})
        over = []
        if max_requests is not None and sample.index.size > max_requests:
            over.append(f"{sample.index.size:,} requests > max_requests {max_requests:,}")
        if max_gpu_hours is not None and hours > max_gpu_hours:
            over.append(f"{hours:.3g} GPU-hours > max_gpu_hours {max_gpu_hours:g}")
        if over:
            sizing.update(needs_tier=False, reason=(
                f"no affordable sample needs the tier: at ratio {r:.4g} the sample's working set is {ws:,} tokens "
                f"against HBM + DRAM {above:,} tokens, and it already costs {'; '.join(over)}"))
            break
        if ws > above:
            sizing.update(needs_tier=True, reason=(f"the sample's working set ({ws:,} tokens) exceeds HBM + DRAM "
                                                   f"({above:,} tokens)"))
            break
        if r >= 1.0:
            sizing.update(needs_tier=False, reason=(
                f"even the whole trace replayed as sampled has a working set of {ws:,} tokens, within HBM + DRAM "
                f"({above:,} tokens)"))
            break
        r = min(1.0, r * min(16.0, max(1.5, above / max(ws, 1) * 1.25)))
    else:
        sizing.update(needs_tier=ws > above, reason="the search stopped after 12 tries")
    sizing["ratio"] = r
    sizing["working_set_tokens"] = ws
    return sample, _finish(sample, sizing, gpus, replays)


def _finish(sample: Sample, sizing: dict[str, Any], gpus: int, replays: int) -> dict[str, Any]:
    sizing["estimated_gpu_hours"] = gpu_hours(float(sample.stats["replay_duration_s"]), gpus, replays)
    sizing["gpu_hours_basis"] = (f"the replay's duration × {max(1, gpus)} GPU(s) × {max(1, replays)} replay(s) "
                                 "(arms × repetitions), at the replayed rate")
    return sizing
