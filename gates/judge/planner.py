"""The sample-size planner: before anyone signs, how many repetitions (and requests) each criterion needs to
pass with the plan's power when the truth equals the published figure, and what that costs in GPU time.

Each criterion's chance of passing is simulated with the judge's own interval functions
(gates/judge/intervals.py) on repetition-level statistics that scatter log-normally with the planning
spread (the CV across repetitions measured at G1, or `planning.spread` before G1). Vectorised: a few
thousand simulated pilots per repetition count, no Python loop per pilot. docs/judge.md, "The planner".
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from gates.judge import intervals
from gates.judge.verdicts import EXTENSION_ALPHA_SHARE, look_confidence, planned_repetitions, soak_warmup
from gates.plan import CriterionSpec, Plan

DEFAULT_SPREAD = 0.06     # CV of a closed-loop repetition's statistic, before G1 measures it
DEFAULT_POWER = 0.90
PILOTS = 4000             # simulated pilots per repetition count (power known to about ±0.5 %)
MAX_REPETITIONS = 40
SEED = 20260629


@dataclass
class CriterionPlan:
    key: str
    gate: int
    kind: str                       # timing | comparison | cv | drift | rate | count | fact | proportion
    published: dict[str, float] = field(default_factory=dict)   # concurrency (or "") → figure
    repetitions_needed: int | None = None
    power_at_plan: float | None = None   # with the plan's repetitions (windows for drift)
    requests_needed: int | None = None
    requests_planned: int | None = None
    decidable: bool = True
    note: str = ""


def _published(plan: Plan, spec: CriterionSpec) -> dict[str, float]:
    """The figure the vendor publishes for a criterion, per concurrency: explicit in planning.published, else
    derived from planning.reference (Table 1) for TTFT and throughput comparisons."""
    planning = plan.planning or {}
    given = (planning.get("published") or {}).get(spec.key)
    if isinstance(given, dict):
        return {str(k): float(v) for k, v in given.items()}
    if given is not None:
        return {str(c): float(given) for c in spec.concurrency} if spec.concurrency else {"": float(given)}
    reference = planning.get("reference") or {}
    cand = {str(k): v for k, v in (reference.get(spec.candidate) or {}).items()}
    base = {str(k): v for k, v in (reference.get(spec.baseline) or {}).items()}
    index = 0 if spec.metric == "ttft" else 1 if spec.metric == "throughput" else None
    if index is None or spec.comparison not in ("speedup", "reduction", "gain"):
        return {}
    out = {}
    for level in (str(c) for c in spec.concurrency or sorted(set(cand) & set(base), key=int)):
        if level in cand and level in base:
            ratio = cand[level][index] / base[level][index]
            out[level] = {"speedup": 1 / ratio, "reduction": 1 - ratio, "gain": ratio - 1}[spec.comparison]
    return out


def _ratio_truth(spec: CriterionSpec, figure: float) -> float:
    """The comparison's figure as candidate ÷ baseline."""
    return {"speedup": 1 / figure, "reduction": 1 - figure, "gain": 1 + figure}[spec.comparison]


def _passes(op: str, threshold: float, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        if op in (">=", ">"):
            return low > threshold if op == ">" else low >= threshold
        return high < threshold if op == "<" else high <= threshold


def comparison_power(spec: CriterionSpec, figure: float, repetitions: int, spread: float, confidence: float,
                     rng: np.random.Generator, pilots: int = PILOTS) -> float:
    sigma = math.sqrt(math.log1p(spread ** 2))
    ratio = _ratio_truth(spec, figure)
    cand = np.exp(math.log(ratio) + sigma * rng.standard_normal((pilots, repetitions)))
    base = np.exp(sigma * rng.standard_normal((pilots, repetitions)))
    r, low, high = intervals.log_ratio(cand, base, confidence)
    value = {"speedup": (1 / high, 1 / low), "reduction": (1 - high, 1 - low), "gain": (low - 1, high - 1)}
    lo, hi = value[spec.comparison]
    return float(np.mean(_passes(spec.op, spec.threshold, lo, hi)))


def cv_power(spec: CriterionSpec, true_cv: float, repetitions: int, confidence: float, rng: np.random.Generator,
             pilots: int = PILOTS) -> float:
    values = 1.0 + true_cv * rng.standard_normal((pilots, repetitions))
    _, low, high = intervals.cv_chi2(values, confidence)
    return float(np.mean(_passes(spec.op, spec.threshold, low, high)))


def drift_power(spec: CriterionSpec, windows: int, warmup: int, spread: float, confidence: float,
                rng: np.random.Generator, pilots: int = PILOTS) -> float:
    steady = windows - warmup
    if steady < 4:
        return 0.0
    half = steady // 2
    sigma = math.sqrt(math.log1p(spread ** 2))
    values = np.exp(sigma * rng.standard_normal((pilots, steady)))  # no drift: the published steady state
    _, low, high = intervals.drift_t(values[:, :half], values[:, half:], confidence)
    return float(np.mean(_passes(spec.op, spec.threshold, low, high)))


def _first_reaching(power_of, target: float, start: int = 2) -> int | None:
    for r in range(start, MAX_REPETITIONS + 1):
        if power_of(r) >= target:
            return r
    return None


def requests_per_repetition(plan: Plan, spec: CriterionSpec, gate: int) -> int:
    """Requests one repetition of the plan's workload sends to the criterion's candidate arm (all levels judged)."""
    loads = plan.workloads
    if spec.phase == "soak":  # one window: its seconds × the candidate's request rate (throughput ÷ output tokens)
        soak = loads.get("soak") or {}
        table = {str(k): v for k, v in ((plan.planning.get("reference") or {}).get(spec.candidate) or {}).items()}
        level = str(soak.get("concurrency", 16))
        if not soak or level not in table:
            return 0
        seconds = float(soak.get("hours", 24)) * 3600 / max(int(soak.get("windows", 1)), 1)
        out_tokens = int((loads.get("cold_recovery") or {}).get("output_tokens", 64))
        return int(seconds * table[level][1] / out_tokens)
    cold = loads.get("cold_recovery") or {}
    per_client = int(cold.get("requests_per_client", 1))
    levels = spec.concurrency or tuple(int(c) for c in ((plan.planning.get("reference") or {}).get(spec.candidate) or {}))
    return sum(per_client * int(c) for c in levels) or per_client * 16


def plan_criteria(plan: Plan, *, spread: float | None = None, seed: int = SEED) -> list[CriterionPlan]:
    """Every criterion of every gate, with what it needs to reach a decision."""
    planning = plan.planning or {}
    spread = float(spread if spread is not None else planning.get("spread", DEFAULT_SPREAD))
    target = float(planning.get("power", DEFAULT_POWER))
    out = []
    for gate in plan.gates:
        reps = planned_repetitions(plan, gate.number)
        for spec in gate.criteria:
            rng = np.random.default_rng([seed, gate.number, len(out)])
            confidence = spec.confidence or plan.confidence
            # the first look spends part of α when the plan may extend (verdicts.look_confidence)
            first = look_confidence(confidence, 0, int(plan.judging.get("max_extra_repetitions", 0)),
                                    float(plan.judging.get("extension_alpha_share", EXTENSION_ALPHA_SHARE)))
            item = CriterionPlan(key=spec.key, gate=gate.number, kind="fact")
            if spec.metric == "error_rate":
                per_rep = requests_per_repetition(plan, spec, gate.number)
                if spec.statistic == "count" or spec.threshold <= 0:
                    item.kind, item.note = "count", "an observed count: decided by what happens, at any sample size"
                else:
                    item.kind = "rate"
                    item.requests_needed = intervals.error_free_needed(spec.threshold, first)
                    if spec.phase == "soak":
                        item.requests_planned = per_rep * int((plan.workloads.get("soak") or {}).get("windows", 0))
                    else:
                        item.requests_planned = per_rep * reps
                    item.decidable = bool(item.requests_planned and item.requests_needed
                                          and item.requests_planned >= item.requests_needed)
                    item.note = (f"needs ≥ {item.requests_needed:,} error-free requests; the plan sends about "
                                 f"{item.requests_planned:,}")
            elif spec.statistic == "cv":
                item.kind = "cv"
                item.published = {"": spread}
                item.power_at_plan = cv_power(spec, spread, reps, first, rng) if reps >= 2 else 0.0
                item.repetitions_needed = _first_reaching(lambda r: cv_power(spec, spread, r, first, rng), target)  # noqa: B023 (called at once, in this iteration)
            elif spec.comparison == "drift":
                soak = plan.workloads.get("soak") or {}
                windows, warmup = int(soak.get("windows", 0)), soak_warmup(plan)
                item.kind = "drift"
                item.published = {"": 0.0}
                item.power_at_plan = drift_power(spec, windows, warmup, spread, first, rng)
                item.repetitions_needed = _first_reaching(
                    lambda w: drift_power(spec, w, warmup, spread, first, rng), target, start=warmup + 4)  # noqa: B023 (called at once, in this iteration)
                item.note = "windows, warm-up windows left out"
            elif spec.comparison in ("speedup", "reduction", "gain"):
                item.kind = "comparison"
                item.published = _published(plan, spec)
                if item.published:
                    def power(r: int, item=item, spec=spec, rng=rng) -> float:
                        return float(np.prod([comparison_power(spec, f, r, spread, first, rng)  # noqa: B023 (called at once, in this iteration)
                                              for f in item.published.values()]))
                    item.power_at_plan = power(reps) if reps >= 2 else 0.0
                    item.repetitions_needed = _first_reaching(power, target)
                else:
                    item.note = "no published figure to plan for (planning.published or planning.reference)"
            elif spec.metric in ("ttft", "throughput"):
                item.kind = "timing"
                item.note = "a recorded positive figure: passes with 2 repetitions"
                item.repetitions_needed, item.power_at_plan = 2, 1.0 if reps >= 2 else 0.0
            elif spec.metric in ("hit_ratio", "read_bw", "output_match", "external_hit_ratio"):
                item.kind = "proportion"
                item.note = "decided by the run's own spread; nearly deterministic when the tier works"
            else:
                item.note = "a recorded fact per node"
            if item.repetitions_needed is None and item.kind in ("comparison", "cv", "drift") and item.published:
                item.note = (item.note + "; " if item.note else "") + f"no plan up to {MAX_REPETITIONS} reaches the power"
            if item.kind in ("comparison", "cv", "drift", "timing") and item.power_at_plan is not None:
                item.decidable = item.power_at_plan >= min(target, 0.8) if item.kind != "timing" else reps >= 2
            out.append(item)
    return out


def gpu_hours_per_repetition(plan: Plan, gate: int) -> float | None:
    """GPU time of one repetition of a gate's cold-recovery workload, estimated from planning.reference:
    a closed-loop client at concurrency c waits c × output tokens ÷ throughput per request; each cache arm
    is populated (one recompute pass) and then measured."""
    reference = (plan.planning or {}).get("reference") or {}
    gate_plan = plan.gate(gate)
    cold = plan.workloads.get("cold_recovery") or {}
    per_client = int(cold.get("requests_per_client", 1))
    output_tokens = int(cold.get("output_tokens", 64))
    gpus = int(plan.expect.get("gpus_per_node", 8))
    recompute = {str(k): v for k, v in (reference.get("recompute") or {}).items()}
    levels: set[str] = set()
    for spec in gate_plan.criteria:
        levels |= {str(c) for c in spec.concurrency}
    seconds = 0.0
    for arm in gate_plan.arms:
        table = {str(k): v for k, v in (reference.get(arm) or {}).items()}
        for level in sorted(levels or set(table), key=int):
            if level not in table:
                continue
            ttft, tput = table[level]
            seconds += per_client * max(int(level) * output_tokens / tput, ttft)
            if arm != "recompute" and recompute:
                populate = next(iter(recompute.values()))[0]
                seconds += per_client * populate
    return seconds * gpus / 3600 if seconds else None


def summary(plan: Plan, *, spread: float | None = None) -> dict:
    """The planner's figures for a whole plan: per criterion, and per gate the repetitions that reach the power
    and their GPU time; `flagged` lists what cannot reach a decision as planned."""
    planning = plan.planning or {}
    used_spread = float(spread if spread is not None else planning.get("spread", DEFAULT_SPREAD))
    criteria = plan_criteria(plan, spread=used_spread)
    gates = []
    for gate in plan.gates:
        items = [c for c in criteria if c.gate == gate.number]
        reps = planned_repetitions(plan, gate.number)
        needed = max([c.repetitions_needed for c in items if c.repetitions_needed and c.kind != "drift"], default=None)
        hours = gpu_hours_per_repetition(plan, gate.number) if gate.number in (1, 2, 3) else None
        gates.append({"gate": gate.number, "planned_repetitions": reps, "repetitions_needed": needed,
                      "gpu_hours_per_repetition": None if hours is None else round(hours, 2),
                      "gpu_hours_planned": None if hours is None else round(hours * reps, 1),
                      "gpu_hours_needed": None if hours is None or needed is None else round(hours * needed, 1)})
    flagged = [c.key for c in criteria if not c.decidable]
    return {"spread": used_spread, "power": float(planning.get("power", DEFAULT_POWER)),
            "spread_source": "given" if spread is not None else ("plan" if "spread" in planning else "default"),
            "criteria": [asdict(c) for c in criteria], "gates": gates, "flagged": flagged}
