"""After a replay: did the server get the reuse the trace allows, and what did each stratum gain? (issue 24)

Pure arithmetic over the replay's request records (`fxpilot.request/1`, with the `stratum` the workload client
copies from the replay CSV) and the oracle — the analysis of the replay CSV itself (`gates.traces.analysis`),
whose unbounded-cache hit tokens are what the trace allows for exactly the requests replayed.

* `fidelity(records, oracle_hit_tokens, share)`: the cache arm's cached prompt tokens ÷ the oracle's; the replay
  is valid for judging reuse when it reached at least `share` of it.
* `strata(records, ttft_objective_s)`: per stratum and arm, requests, TTFT p50, the speed-up of the cache arm
  over recompute and goodput (the share of requests whose first token came within the objective, as the
  serving benchmarks report it). A trace with little reuse says so instead of judging.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from gates.traces.analysis import LITTLE_REUSE, STRATA


def _ok(record: dict) -> bool:
    return record.get("status") == "ok" and record.get("t_first_token") is not None


def fidelity(records: Iterable[dict], oracle_hit_tokens: int, share: float, arm: str = "fx",
             repetitions: int | None = None) -> dict[str, Any]:
    """How much of the reuse the trace allows the `arm` replay reached (its records' cached tokens, per
    repetition on average, ÷ the oracle's hit tokens)."""
    cached: dict[int, int] = defaultdict(int)
    for r in records:
        if r.get("arm") == arm and r.get("phase") == "replay" and r.get("status") == "ok":
            cached[int(r.get("repetition", 1))] += int(r.get("cached_tokens") or 0)
    reps = repetitions or max(1, len(cached))
    measured = sum(cached.values()) / reps if cached else 0.0
    reached = measured / oracle_hit_tokens if oracle_hit_tokens else None
    return {"name": "replay-reached-trace-reuse", "measured_hit_tokens": measured,
            "oracle_hit_tokens": int(oracle_hit_tokens), "reached": reached, "required": share,
            "ok": bool(oracle_hit_tokens == 0 or (reached is not None and reached >= share))}


def _p50(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(0.5 * len(ordered)) - 1))]


def strata(records: Iterable[dict], ttft_objective_s: float | None = None, cache_arm: str = "fx",
           baseline_arm: str = "recompute", ideal_hit_fraction: float | None = None) -> dict[str, Any]:
    """Per stratum: requests, TTFT p50 and goodput per arm, and the cache arm's TTFT speed-up over the baseline."""
    ttft: dict[tuple[str, str], list[float]] = defaultdict(list)
    sent: dict[tuple[str, str], int] = defaultdict(int)
    for r in records:
        if r.get("phase") != "replay":
            continue
        key = (r.get("stratum") or "unstratified", r.get("arm"))
        sent[key] += 1
        if _ok(r):
            ttft[key].append(float(r["t_first_token"]) - float(r["t_send"]))
    names = [s for s in (*STRATA, "unstratified") if any(k[0] == s for k in sent)]
    out: dict[str, Any] = {"strata": {}, "ttft_objective_s": ttft_objective_s}
    for name in names:
        row: dict[str, Any] = {}
        for arm in sorted({k[1] for k in sent if k[0] == name}):
            values = ttft[(name, arm)]
            row[arm] = {"requests": sent[(name, arm)], "ttft_p50_s": _p50(values),
                        "goodput": (sum(v <= ttft_objective_s for v in values) / sent[(name, arm)]
                                    if ttft_objective_s is not None and sent[(name, arm)] else None)}
        cache, base = row.get(cache_arm, {}).get("ttft_p50_s"), row.get(baseline_arm, {}).get("ttft_p50_s")
        row["speedup"] = base / cache if cache and base else None
        row["tier_can_help"] = name in ("shared_prefix", "returning")
        out["strata"][name] = row
    if ideal_hit_fraction is not None and ideal_hit_fraction < LITTLE_REUSE:
        out["little_reuse"] = True
        out["summary"] = (f"this traffic has little reuse: at most {100 * ideal_hit_fraction:.1f} % of its prompt "
                          f"tokens could ever come from a cache, so the replay cannot show a cache tier's benefit — "
                          f"this is the traffic, not an FX failure")
    else:
        out["little_reuse"] = False
    return out
