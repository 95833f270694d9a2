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

from gates.traces import capacity
from gates.traces.analysis import analyse, reuse_report
from gates.traces.formats import TraceFormatError, read_bytes
from gates.traces.sample import choose, replay_csv


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


def prepare(data: bytes, replay: dict[str, Any], *, vllm_flags: list[str] = (), name: str = "trace") -> tuple[bytes, dict]:
    """(replay CSV bytes, what was chosen) for a trace's bytes and the plan's replay settings."""
    try:
        trace = read_bytes(data, name)
    except TraceFormatError as error:
        raise ValueError(str(error)) from None
    analysis = analyse(trace)
    window = replay.get("window_s")
    ratio = replay.get("sample_ratio")
    if ratio is None:   # the older plans' session budget, now a ratio: whole sessions spread over the trace
        budget = int(replay.get("max_sessions") or 0)
        ratio = min(1.0, budget / analysis.sessions) if budget and analysis.sessions else 1.0
    sample = choose(analysis, ratio=None if window else float(ratio),
                    window=tuple(window) if window else None, seed=int(replay.get("seed", 20260629)),
                    speedup=float(replay.get("speedup", 1.0)),
                    idle_gap_cap_s=(float(replay["idle_gap_cap_s"]) if replay.get("idle_gap_cap_s") is not None else None),
                    max_model_len=(int(replay["max_model_len"]) if replay.get("max_model_len")
                                   else max_model_len(list(vllm_flags))),
                    over_length=str(replay.get("over_length", "cut")))
    stats = dict(sample.stats, format=trace.format, format_name=trace.format_name,
                 sessions_basis=trace.session_basis, reuse_basis=trace.reuse_basis)
    data = replay_csv(sample).encode()
    stats["oracle"] = (oracle(data, stats.get("block_tokens"), replay.get("capacity_check"))
                       if stats.get("reuse_known") else None)
    stats["schema"] = REPLAY_SAMPLE_SCHEMA
    return data, stats


REPLAY_SAMPLE_SCHEMA = "fxpilot.replay-sample/1"   # the judge reads the oracle from it (gates.judge.records)


def oracle(replay: bytes, block_tokens: int | None, check: dict[str, Any] | None = None,
           chunk_tokens: int = 256) -> dict[str, Any] | None:
    """What the replayed requests allow a cache (the analysis of the replay CSV itself, unbounded cache): the
    hit tokens gates.traces.fidelity compares the records' cached tokens with, overall and per stratum; and the
    capped replay's cap and the LRU hit share the oracle predicts for it (gates.traces.capacity)."""
    try:
        analysis = analyse(read_bytes(replay, "replay.csv", "fxpilot", block_tokens=block_tokens))
    except TraceFormatError:
        return None
    found = reuse_report(analysis)
    if not found.get("known"):
        return None
    check = dict(check or {})
    return {"ideal_hit_tokens": found["ideal_hit_tokens"], "ideal_hit_fraction": found["ideal_hit_fraction"],
            "input_tokens": analysis.reuse.input_tokens, "strata": found["strata"],
            "capacity_check": capacity.plan(analysis, share=float(check.get("share", capacity.DEFAULT_SHARE)),
                                            fraction=float(check.get("fraction", capacity.DEFAULT_FRACTION)),
                                            chunk_tokens=chunk_tokens)
                              | {"tolerance": float(check.get("tolerance", capacity.DEFAULT_TOLERANCE))}}


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
    return "; ".join(parts)

