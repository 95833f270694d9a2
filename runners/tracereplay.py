"""What G4 sends to the workload client: the customer's trace, in whatever public format it came, sampled by
whole sessions and written as fxpilot's replay CSV with content-addressed block ids (docs/traces.md).

The plan's `workloads.replay` may set `sample_ratio` (share of the sessions; without it `max_sessions` ÷ the
trace's sessions, else all), `window_s`
([start, end] seconds instead of a ratio), `speedup` (default 1), `idle_gap_cap_s` (default none),
`max_model_len` (the deployment's context, else the `--max-model-len` among the vLLM flags given),
`over_length` (`cut` or `out`, for prompts over it) and `seed`; `capacity_check` (`fraction`, `share`, `tolerance`)
sets the capped replay's cap (gates.traces.capacity).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from gates.traces import capacity, tiers
from gates.traces.analysis import analyse, reuse_report
from gates.traces.formats import TraceFormatError, read_bytes
from gates.traces.sample import (
    choose,
    cross_session_blocks,
    gpu_hours,
    replay_csv,
    sample_arrays,
    size_for_tier,
    working_set,
)


def max_model_len(flags: list[str]) -> int | None:
    """`--max-model-len N` (or `=N`) among vLLM flags."""
    for i, flag in enumerate(flags):
        value = flag.split("=", 1)[1] if flag.startswith("--max-model-len=") else (
            flags[i + 1] if flag == "--max-model-len" and i + 1 < len(flags) else None)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def prepare(data: bytes, replay: dict[str, Any], *, vllm_flags: list[str] = (), name: str = "trace",
            hbm_tokens: int | None = None, dram_tokens: int | None = None) -> tuple[bytes, dict]:
    """(replay CSV bytes, what was chosen) for a trace's bytes and the plan's replay settings.

    `hbm_tokens` (vLLM's KV cache in tokens, from the nodes' vllm:cache_config_info) and `dram_tokens` (LMCache's
    DRAM in tokens, from the deployment's DRAM size) are what sits above FX: the sample is sized so that its working
    set exceeds them (gates.traces.sample.size_for_tier; the plan's `size_for_tier: false` turns it off), the oracle
    predicts each tier's share (gates.traces.tiers) and the capacity check puts DRAM in front of the capped FX tier.
    Deterministic on the same inputs (the capacity step prepares the same sample again)."""
    try:
        trace = read_bytes(data, name)
    except TraceFormatError as error:
        raise ValueError(str(error)) from None
    analysis = analyse(trace)
    window = replay.get("window_s")
    ratio = replay.get("sample_ratio")
    explicit = ratio is not None
    if ratio is None:   # the older plans' session budget, now a ratio: whole sessions spread over the trace
        budget = int(replay.get("max_sessions") or 0)
        ratio = min(1.0, budget / analysis.sessions) if budget and analysis.sessions else 1.0
    timing = dict(seed=int(replay.get("seed", 20260629)), speedup=float(replay.get("speedup", 1.0)),
                  idle_gap_cap_s=(float(replay["idle_gap_cap_s"]) if replay.get("idle_gap_cap_s") is not None else None),
                  max_model_len=(int(replay["max_model_len"]) if replay.get("max_model_len")
                                 else max_model_len(list(vllm_flags))),
                  over_length=str(replay.get("over_length", "cut")))
    share = float((replay.get("capacity_check") or {}).get("share", capacity.DEFAULT_SHARE))
    sizing: dict[str, Any] | None = None
    if window:
        sample = choose(analysis, window=tuple(window), **timing)
    elif replay.get("size_for_tier", True) and (hbm_tokens or dram_tokens) and analysis.reuse is not None:
        sample, sizing = size_for_tier(
            analysis, hbm_tokens, dram_tokens, share=share, ratio=float(ratio) if explicit else None,
            max_requests=int(replay["max_requests"]) if replay.get("max_requests") else None,
            max_gpu_hours=float(replay["max_gpu_hours"]) if replay.get("max_gpu_hours") else None,
            gpus=int(replay.get("gpus", 1)), replays=int(replay.get("replays", 1)), **timing)
    else:
        sample = choose(analysis, ratio=float(ratio), keep_shared=bool(replay.get("keep_shared", True)), **timing)
    stats = dict(sample.stats, format=trace.format, format_name=trace.format_name, file=trace.name,
                 sessions_basis=trace.session_basis, reuse_basis=trace.reuse_basis,
                 trace_warnings=list(trace.warnings))
    if sizing is None:
        sizing = {"needs_tier": None, "hbm_tokens": hbm_tokens, "dram_tokens": dram_tokens,
                  "above_fx_tokens": int(hbm_tokens or 0) + int(dram_tokens or 0),
                  "reason": ("a time window was asked for: the sample is not sized" if window else
                             "reuse unknown: no working set to size from" if analysis.reuse is None else
                             "the plan turned sizing off (size_for_tier: false)" if hbm_tokens or dram_tokens else
                             "the HBM and DRAM sizes are not known: the plan's sample is replayed")}
        if analysis.reuse is not None:
            sizing["working_set_tokens"] = working_set(sample, analysis.reuse.block_tokens, share)
            if hbm_tokens or dram_tokens:
                sizing["needs_tier"] = sizing["working_set_tokens"] > sizing["above_fx_tokens"]
        sizing["estimated_gpu_hours"] = gpu_hours(float(sample.stats["replay_duration_s"]),
                                                  int(replay.get("gpus", 1)), int(replay.get("replays", 1)))
    stats["sizing"] = sizing
    if analysis.reuse is not None:
        t = analysis.trace
        stats["trace_cross_session_blocks"] = cross_session_blocks(analysis.session, t.block_offsets, t.block_ids)
        offsets, ids, _, _ = sample_arrays(sample)
        sessions = np.unique(np.array(sample.session, dtype=object), return_inverse=True)[1].reshape(-1)
        stats["sampled_cross_session_blocks"] = cross_session_blocks(sessions, offsets, ids)
        stats["trace_ideal_hit_fraction"] = reuse_report(analysis)["ideal_hit_fraction"]
        stats["trace_capacity_for_share_tokens"] = (None if (b := analysis.reuse.capacity_for(share)) is None
                                                    else b * analysis.reuse.block_tokens)
        if hbm_tokens or dram_tokens:
            stats["trace_tiers"] = tiers.report(analysis, int(hbm_tokens or 0), int(dram_tokens or 0),
                                                share_points=(share,))
    data = replay_csv(sample).encode()
    stats["oracle"] = (oracle(data, stats.get("block_tokens"), replay.get("capacity_check"),
                              hbm_tokens=hbm_tokens, dram_tokens=dram_tokens, sample=sample,
                              buy_tokens=stats.get("trace_capacity_for_share_tokens"))
                       if stats.get("reuse_known") else None)
    stats["schema"] = REPLAY_SAMPLE_SCHEMA
    return data, stats


# The judge reads the oracle from it (gates.judge.records). Revision 2 of its contents (sizing, tier shares, the
# capped replay's rows for the order-faithful check) is additive: the schema name stays until gates.judge.records
# reads "fxpilot.replay-sample/2" (docs/traces.md).
REPLAY_SAMPLE_SCHEMA = "fxpilot.replay-sample/1"


def oracle(replay: bytes, block_tokens: int | None, check: dict[str, Any] | None = None,
           chunk_tokens: int = 256, *, hbm_tokens: int | None = None, dram_tokens: int | None = None,
           sample=None, buy_tokens: int | None = None) -> dict[str, Any] | None:
    """What the replayed requests allow a cache (the analysis of the replay CSV itself, unbounded cache): the
    hit tokens gates.traces.fidelity compares the records' cached tokens with, overall and per stratum; the share
    of them HBM, DRAM and FX serve (gates.traces.tiers, with the sizes above FX); and the capped replay's cap, the
    hit share the cascade predicts for it and the replayed rows in order (gates.traces.capacity)."""
    try:
        analysis = analyse(read_bytes(replay, "replay.csv", "fxpilot", block_tokens=block_tokens))
    except TraceFormatError:
        return None
    found = reuse_report(analysis)
    if not found.get("known"):
        return None
    check = dict(check or {})
    capped = capacity.plan(analysis, share=float(check.get("share", capacity.DEFAULT_SHARE)),
                           fraction=float(check.get("fraction", capacity.DEFAULT_FRACTION)),
                           chunk_tokens=chunk_tokens, dram_tokens=int(dram_tokens or 0))
    capped["tolerance"] = float(check.get("tolerance", capacity.DEFAULT_TOLERANCE))
    capped["order_tolerance"] = float(check.get("order_tolerance", capacity.DEFAULT_ORDER_TOLERANCE))
    if capped.get("applicable") and buy_tokens:
        # the scale the check runs at against the capacity being bought (the whole trace's, for `share`)
        capped["buy_capacity_tokens"] = int(buy_tokens)
        capped["scale"] = capped["capacity_tokens"] / buy_tokens
    if sample is not None:
        capped["rows"] = capacity.rows(sample.session, sample.turn, sample.prompt_tokens, sample.blocks)
    out = {"ideal_hit_tokens": found["ideal_hit_tokens"], "ideal_hit_fraction": found["ideal_hit_fraction"],
           "input_tokens": analysis.reuse.input_tokens, "strata": found["strata"], "capacity_check": capped}
    if hbm_tokens or dram_tokens:
        out["tiers"] = tiers.report(analysis, int(hbm_tokens or 0), int(dram_tokens or 0))
    return out


def describe(stats: dict) -> str:
    """One line for the run's log (and the reports): the sampled share and the replayed rate."""
    rate = stats.get("replay_rate_per_s")
    trace_rate = stats.get("trace_rate_per_s")
    parts = [f"{stats['format_name']}: replaying {stats['sampled_requests']} of {stats['trace_requests']} requests "
             f"({100 * stats['sampled_share']:.1f} %, {stats['sampled_sessions']} whole sessions)"]
    if rate and trace_rate:
        parts.append(f"at {rate:.3g} requests/s against the trace's {trace_rate:.3g} (speed-up {stats['speedup']:g}"
                     + (f", idle gaps capped at {stats['idle_gap_cap_s']:g} s" if stats.get("idle_gap_cap_s") else "")
                     + ")")
    if stats.get("over_length_requests"):
        parts.append(f"{stats['over_length_requests']} prompt(s) over max_model_len "
                     + ("cut" if stats["over_length"] == "cut" else "left out"))
    if not stats.get("reuse_known"):
        parts.append("reuse unknown for this format")
    sizing = stats.get("sizing") or {}
    if sizing.get("needs_tier") is not None:
        parts.append(("the sample needs the tier: " if sizing["needs_tier"] else "the sample does not need the tier: ")
                     + str(sizing.get("reason") or ""))
    return "; ".join(parts)

