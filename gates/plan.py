"""The plan file: what both parties sign. Loaded from YAML, validated on every load.

Pure module (no ORM at import); `plan_from_version` adapts a stored PlanVersion. The format is
documented in docs/plan-format.md. Every error names the file, the gate and the field.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

# libyaml's safe loader where PyYAML has it (its wheels do): about ten times the pure-Python one (a plan file:
# 7.5 ms against 88 ms), which every new pilot and every test's demo pilot paid; the same documents, the same types.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

PLAN_SCHEMA = "fxpilot.plan/1"
PLANS_DIR = Path(__file__).resolve().parent / "plans"

METRICS = {
    # from request records (fxpilot.request/1)
    "ttft", "throughput", "error_rate", "hit_ratio", "output_match",
    # from phase summaries' /metrics deltas (fxpilot.phase/1): the external tier's share of what HBM missed
    "external_hit_ratio",
    # G4's capacity check: |external-hit share of the capped replay (/metrics) − the oracle's prediction for its cap|
    "capacity_agreement",
    # from request records: the share of requests meeting the plan's TTFT and inter-token objectives
    "goodput",
    # from LMCache retrieval records (fxpilot.retrieve/1)
    "read_bw",
    # from node inventories (fxpilot.inventory/1)
    "gpu_count", "gpu_model_match", "rocm_version", "versions_recorded", "link_speed_gbps",
    "fx_mounted_writable", "fio_read_gbps",
}
INVENTORY_METRICS = {"gpu_count", "gpu_model_match", "rocm_version", "versions_recorded", "link_speed_gbps",
                     "fx_mounted_writable", "fio_read_gbps"}
STATISTICS = {"p50", "p90", "p99", "mean", "cv", "min", "max", "value", "count"}
COMPARISONS = {"absolute", "speedup", "reduction", "gain", "drift"}
OPERATORS = {">=", "<=", ">", "<", "=="}
PHASES = {"populate", "measure", "probe", "replay", "soak", "fault", "recovery", "share", "capacity", "any"}
GATE_NUMBERS = (1, 2, 3, 4)
TRACE_GATE = 4
"""The gate that replays the customer's session trace; only its plan may allow a generated sample trace."""
SAMPLE_TRACE_WORDS = {"allowed": True, "refused": False}


class PlanError(ValueError):
    """A plan that cannot be used. `where` is file › gate › field."""

    def __init__(self, source: str, where: str, message: str):
        self.source, self.where, self.message = source, where, message
        super().__init__(f"{source}: {where}: {message}" if where else f"{source}: {message}")


@dataclass(frozen=True)
class CriterionSpec:
    key: str
    description: str
    metric: str
    statistic: str
    comparison: str
    op: str
    threshold: float
    unit: str = ""
    candidate: str = ""
    baseline: str = ""
    phase: str = "measure"
    concurrency: tuple[int, ...] = ()
    description_zh: str = ""
    confidence: float | None = None  # None: the plan's judging.confidence
    # False: a figure the verdict reports and explains but that does not decide the gate (docs/plan-format.md)
    gating: bool = True


@dataclass(frozen=True)
class GatePlan:
    number: int
    name: str
    weeks: tuple[int, int]
    criteria: tuple[CriterionSpec, ...]
    arms: tuple[str, ...] = ()
    name_zh: str = ""
    proves: str = ""
    proves_zh: str = ""
    # G4 only: both parties allow G4 to replay a generated sample trace instead of the customer's own.
    sample_trace: bool = False

    @property
    def label(self) -> str:
        return f"G{self.number}"


@dataclass(frozen=True)
class Plan:
    name: str
    gates: tuple[GatePlan, ...]
    judging: dict[str, Any] = field(default_factory=dict)
    expect: dict[str, Any] = field(default_factory=dict)
    workloads: dict[str, Any] = field(default_factory=dict)
    calendar_weeks: int = 10
    name_zh: str = ""
    source: str = ""
    schema: str = PLAN_SCHEMA
    planning: dict[str, Any] = field(default_factory=dict)  # the sample-size planner's inputs (docs/plan-format.md)

    def gate(self, number_or_label: int | str) -> GatePlan:
        number = parse_gate_label(number_or_label)
        for gate in self.gates:
            if gate.number == number:
                return gate
        raise KeyError(f"the plan has no gate {number_or_label}")

    @property
    def confidence(self) -> float:
        return float(self.judging.get("confidence", 0.95))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("source")
        if not data["planning"]:
            data.pop("planning")  # plans written before the planner hash as they always did
        for gate in data["gates"]:
            if not gate["sample_trace"]:
                gate.pop("sample_trace")  # plans that do not allow the sample hash as they always did
            for criterion in gate["criteria"]:
                if criterion["gating"]:
                    criterion.pop("gating")  # plans whose every criterion gates hash as they always did
        return data

    def canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


def parse_gate_label(value: int | str) -> int:
    text = str(value).strip().upper().removeprefix("G")
    if not text.isdigit() or int(text) not in GATE_NUMBERS:
        raise KeyError(f"{value!r} is not a gate; use G1, G2, G3 or G4")
    return int(text)


def plan_path(name: str) -> Path:
    """A plan by name (`default` → gates/plans/default.yaml) or by path."""
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml", ".json") and candidate.exists():
        return candidate
    named = PLANS_DIR / f"{name}.yaml"
    if named.exists():
        return named
    raise PlanError(name, "", f"no plan file by that name or path (named plans: {', '.join(sorted(p.stem for p in PLANS_DIR.glob('*.yaml')))})")


def load_plan(name_or_path: str | Path = "default") -> Plan:
    path = plan_path(str(name_or_path))
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise PlanError(str(path), where, f"not valid YAML: {getattr(error, 'problem', error)}") from None
    except UnicodeDecodeError:
        raise PlanError(str(path), "", "not UTF-8 text") from None
    return validate_plan(data, source=str(path))


def validate_plan(data: Any, *, source: str = "<plan>") -> Plan:
    if not isinstance(data, dict):
        raise PlanError(source, "", "the plan must be a mapping at the top level")
    schema = data.get("schema", PLAN_SCHEMA)
    if schema != PLAN_SCHEMA:
        raise PlanError(source, "schema", f"unknown schema {schema!r}; this fxpilot reads {PLAN_SCHEMA!r}")
    name = _text(data, "name", source, "", required=True)
    judging = data.get("judging") or {}
    if not isinstance(judging, dict):
        raise PlanError(source, "judging", "must be a mapping")
    judging = {**{"confidence": 0.95, "bootstrap_resamples": 1000, "seed": 0, "min_requests_per_cell": 8,
                  "min_cell_seconds": 0.0, "max_extra_repetitions": 2}, **judging}
    confidence = _number(judging, "confidence", source, "judging")
    if not 0.5 <= confidence < 1:
        raise PlanError(source, "judging › confidence", f"{confidence} must be at least 0.5 and below 1")
    for key in ("bootstrap_resamples", "seed", "min_requests_per_cell", "max_extra_repetitions"):
        value = judging[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PlanError(source, f"judging › {key}", f"{value!r} is not a whole number ≥ 0")
    _number(judging, "min_cell_seconds", source, "judging")
    _sequential(judging, data.get("workloads") or {}, source)

    raw_gates = data.get("gates")
    if not isinstance(raw_gates, list) or not raw_gates:
        raise PlanError(source, "gates", "the plan must list its four gates")
    gates: dict[int, GatePlan] = {}
    keys: set[str] = set()
    for index, raw in enumerate(raw_gates, start=1):
        where = f"gates[{index}]"
        if not isinstance(raw, dict):
            raise PlanError(source, where, "each gate must be a mapping")
        number = raw.get("number")
        if isinstance(number, bool) or number not in GATE_NUMBERS:
            raise PlanError(source, f"{where} › number", f"{number!r} is not a gate number (1–4)")
        where = f"G{number}"
        if number in gates:
            raise PlanError(source, f"{where} › number", f"two gates have the number {number}")
        weeks = raw.get("weeks")
        if (not isinstance(weeks, list) or len(weeks) != 2 or not all(isinstance(w, int) and not isinstance(w, bool) for w in weeks)
                or not 1 <= weeks[0] <= weeks[1] <= int(data.get("calendar_weeks", 10))):
            raise PlanError(source, f"{where} › weeks", f"{weeks!r} must be [first, last] weeks within the calendar")
        arms = raw.get("arms") or []
        if not isinstance(arms, list) or not all(isinstance(a, str) and a for a in arms):
            raise PlanError(source, f"{where} › arms", "must be a list of arm names")
        raw_criteria = raw.get("criteria")
        if not isinstance(raw_criteria, list) or not raw_criteria:
            raise PlanError(source, f"{where} › criteria", "a gate needs at least one criterion")
        criteria = []
        for position, crit in enumerate(raw_criteria, start=1):
            spec = _criterion(crit, source, f"{where} › criteria[{position}]")
            if spec.key in keys:
                raise PlanError(source, f"{where} › criteria[{position}] › key", f"the key {spec.key!r} is used twice")
            keys.add(spec.key)
            criteria.append(spec)
        gates[number] = GatePlan(
            number=number,
            name=_text(raw, "name", source, where, required=True),
            name_zh=_text(raw, "name_zh", source, where),
            weeks=(weeks[0], weeks[1]),
            proves=_text(raw, "proves", source, where),
            proves_zh=_text(raw, "proves_zh", source, where),
            arms=tuple(arms),
            criteria=tuple(criteria),
            sample_trace=_sample_trace(raw, number, source, where),
        )
    missing = [f"G{n}" for n in GATE_NUMBERS if n not in gates]
    if missing:
        raise PlanError(source, "gates", f"missing {', '.join(missing)}; a plan has exactly the gates G1–G4")
    ordered = [gates[n] for n in GATE_NUMBERS]
    for before, after in zip(ordered, ordered[1:], strict=False):
        if after.weeks[0] <= before.weeks[1]:
            raise PlanError(source, f"G{after.number} › weeks", f"starts in week {after.weeks[0]}, before G{before.number} ends (week {before.weeks[1]})")
    for section in ("expect", "workloads", "planning"):
        if not isinstance(data.get(section, {}), dict):
            raise PlanError(source, section, "must be a mapping")
    return Plan(
        name=name,
        name_zh=_text(data, "name_zh", source, ""),
        gates=tuple(ordered),
        judging=judging,
        expect=dict(data.get("expect") or {}),
        workloads=dict(data.get("workloads") or {}),
        calendar_weeks=int(data.get("calendar_weeks", 10)),
        source=source,
        planning=_planning(data.get("planning") or {}, source),
    )


def _sequential(judging: dict, workloads: Any, source: str) -> None:
    """`judging.looks` (repetition counts at which the judge may decide, ascending; the last is the cold-recovery
    workload's repetitions), `runs` (how many runs a gate may have), `rerun_alpha_share` (the part of α kept for
    the runs after the first), `clock_tolerance_s` and `copy_tolerance_s` (validity). Absent keys keep their
    documented defaults at use (gates.judge.sequential) and are not written into the plan, so plans signed
    before them hash as they always did."""
    looks = judging.get("looks")
    if looks is not None:
        if (not isinstance(looks, list) or not looks
                or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in looks)
                or any(b <= a for a, b in zip(looks, looks[1:], strict=False))):
            raise PlanError(source, "judging › looks", f"{looks!r} must be a list of ascending whole numbers of "
                            "repetitions ≥ 1, e.g. [8, 12, 16, 20, 24]")
        cold = (workloads.get("cold_recovery") or {}) if isinstance(workloads, dict) else {}
        planned = cold.get("repetitions") if isinstance(cold, dict) else None
        if planned is not None and planned != looks[-1]:
            raise PlanError(source, "judging › looks", f"the last look ({looks[-1]}) must be the cold-recovery "
                            f"workload's repetitions ({planned})")
    runs = judging.get("runs")
    if runs is not None and (isinstance(runs, bool) or not isinstance(runs, int) or runs < 1):
        raise PlanError(source, "judging › runs", f"{runs!r} is not a whole number ≥ 1")
    for key in ("rerun_alpha_share",):
        if key in judging:
            value = _number(judging, key, source, "judging")
            if not 0 <= value < 1:
                raise PlanError(source, f"judging › {key}", f"{value} must be at least 0 and below 1")
    for key in ("clock_tolerance_s", "copy_tolerance_s"):
        if key in judging:
            value = _number(judging, key, source, "judging")
            if value < 0:
                raise PlanError(source, f"judging › {key}", f"{value} must be ≥ 0")
    if "rate_confidence" in judging:
        value = _number(judging, "rate_confidence", source, "judging")
        if not 0.5 <= value < 1:
            raise PlanError(source, "judging › rate_confidence", f"{value} must be at least 0.5 and below 1")


def _sample_trace(raw: dict, number: int, source: str, where: str) -> bool:
    """`sample_trace: allowed` (or true) lets G4 replay a generated sample trace; absent, `refused` or false: not."""
    value = raw.get("sample_trace", False)
    if isinstance(value, str) and value.strip().lower() in SAMPLE_TRACE_WORDS:
        value = SAMPLE_TRACE_WORDS[value.strip().lower()]
    if value is None:
        value = False
    if not isinstance(value, bool):
        raise PlanError(source, f"{where} › sample_trace", f"{value!r} must be allowed or refused (or true or false)")
    if value and number != TRACE_GATE:
        raise PlanError(source, f"{where} › sample_trace",
                        f"only G{TRACE_GATE} replays a trace; a sample trace cannot be allowed for G{number}")
    return value


def _planning(raw: dict, source: str) -> dict[str, Any]:
    """`planning`: spread (CV across repetitions before G1 measures one), power, reference (arm → concurrency →
    [TTFT p50 s, throughput tok/s]) and published (criterion key → figure, or concurrency → figure)."""
    if not raw:
        return {}
    out = dict(raw)
    for key in ("spread", "power", "soak_window_spread", "drift_power", "drift_detect"):
        if key in raw:
            value = _number(raw, key, source, "planning")
            if not 0 < value < 1:
                raise PlanError(source, f"planning › {key}", f"{value} must be between 0 and 1")
    if "soak_request_spread" in raw:
        value = _number(raw, "soak_request_spread", source, "planning")
        if not 0 < value <= 5:
            raise PlanError(source, "planning › soak_request_spread", f"{value} must be a log-SD above 0 (0.35 is 35 %)")
    reference = raw.get("reference") or {}
    if not isinstance(reference, dict):
        raise PlanError(source, "planning › reference", "must map arm → concurrency → [TTFT p50, throughput]")
    for arm, levels in reference.items():
        if not isinstance(levels, dict):
            raise PlanError(source, f"planning › reference › {arm}", "must map concurrency → [TTFT p50, throughput]")
        for level, pair in levels.items():
            ok = (isinstance(pair, list) and len(pair) == 2
                  and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in pair))
            if not ok or not str(level).isdigit():
                raise PlanError(source, f"planning › reference › {arm} › {level}",
                                f"{pair!r} must be [TTFT p50 s, throughput tok/s] under a whole concurrency")
    published = raw.get("published") or {}
    if not isinstance(published, dict):
        raise PlanError(source, "planning › published", "must map criterion key → figure")
    for key, value in published.items():
        values = value.values() if isinstance(value, dict) else [value]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise PlanError(source, f"planning › published › {key}", f"{value!r} is not a number (or concurrency → number)")
    return out


def _criterion(raw: Any, source: str, where: str) -> CriterionSpec:
    if not isinstance(raw, dict):
        raise PlanError(source, where, "each criterion must be a mapping")
    key = _text(raw, "key", source, where, required=True)
    metric = raw.get("metric")
    if metric not in METRICS:
        raise PlanError(source, f"{where} › metric", f"unknown metric {metric!r}; known: {', '.join(sorted(METRICS))}")
    statistic = raw.get("statistic")
    if statistic not in STATISTICS:
        raise PlanError(source, f"{where} › statistic", f"unknown statistic {statistic!r}; known: {', '.join(sorted(STATISTICS))}")
    comparison = raw.get("comparison", "absolute")
    if comparison not in COMPARISONS:
        raise PlanError(source, f"{where} › comparison", f"unknown comparison {comparison!r}; known: {', '.join(sorted(COMPARISONS))}")
    op = raw.get("op")
    if statistic == "count" and metric != "error_rate":
        raise PlanError(source, f"{where} › statistic", "'count' (an observed number of failed requests) is for error_rate")
    if op not in OPERATORS:
        raise PlanError(source, f"{where} › op", f"{op!r} is not an operator; use one of {' '.join(sorted(OPERATORS))}")
    threshold = _number(raw, "threshold", source, where)
    candidate = raw.get("candidate", "") or ""
    baseline = raw.get("baseline", "") or ""
    if comparison in ("speedup", "reduction", "gain") and not (candidate and baseline):
        raise PlanError(source, f"{where} › baseline", f"a {comparison} compares two arms: name candidate and baseline")
    if comparison in ("absolute", "drift") and baseline and metric != "output_match":
        raise PlanError(source, f"{where} › baseline", f"an {comparison} criterion compares no baseline")
    if metric not in INVENTORY_METRICS and metric != "read_bw" and not candidate:
        raise PlanError(source, f"{where} › candidate", f"metric {metric!r} needs the arm it is measured on (candidate)")
    phase = raw.get("phase", "measure")
    if phase not in PHASES:
        raise PlanError(source, f"{where} › phase", f"unknown phase {phase!r}; known: {', '.join(sorted(PHASES))}")
    concurrency = raw.get("concurrency", []) or []
    if not isinstance(concurrency, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in concurrency):
        raise PlanError(source, f"{where} › concurrency", f"{concurrency!r} must be a list of positive whole numbers")
    gating = raw.get("gating", True)
    if not isinstance(gating, bool):
        raise PlanError(source, f"{where} › gating", f"{gating!r} must be true (the criterion decides the gate) or "
                        "false (a figure reported beside the gate's criteria)")
    confidence = raw.get("confidence")
    if confidence is not None:
        confidence = _number(raw, "confidence", source, where)
        if not 0.5 <= confidence < 1:
            raise PlanError(source, f"{where} › confidence", f"{confidence} must be at least 0.5 and below 1")
    return CriterionSpec(
        key=key,
        description=_text(raw, "description", source, where, required=True),
        description_zh=_text(raw, "description_zh", source, where),
        metric=metric,
        statistic=statistic,
        comparison=comparison,
        op=op,
        threshold=threshold,
        unit=str(raw.get("unit", "")),
        candidate=str(candidate),
        baseline=str(baseline),
        phase=phase,
        concurrency=tuple(concurrency),
        confidence=confidence,
        gating=gating,
    )


def _text(raw: dict, key: str, source: str, where: str, *, required: bool = False) -> str:
    value = raw.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise PlanError(source, f"{where} › {key}" if where else key, f"{value!r} is not text")
    if required and not value.strip():
        raise PlanError(source, f"{where} › {key}" if where else key, "is required")
    return value


def _number(raw: dict, key: str, source: str, where: str) -> float:
    value = raw.get(key)
    label = f"{where} › {key}" if where else key
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(source, label, f"{value!r} is not a number")
    if not math.isfinite(value):
        raise PlanError(source, label, f"{value!r} is not a finite number")
    return float(value)


def plan_from_version(version) -> Plan:
    """Rebuild the Plan from a stored PlanVersion: its document plus its (possibly edited) criteria rows."""
    document = dict(version.document)
    rows: dict[int, list[dict]] = {}
    for row in version.criteria.order_by("gate_number", "position"):
        item = {
            "key": row.key, "description": row.description, "description_zh": row.description_zh,
            "metric": row.metric, "statistic": row.statistic, "comparison": row.comparison,
            "op": row.op, "threshold": row.threshold, "unit": row.unit, "phase": row.phase,
            "concurrency": list(row.concurrency),
        }
        for optional in ("candidate", "baseline"):
            if getattr(row, optional):
                item[optional] = getattr(row, optional)
        if row.confidence != float(document.get("judging", {}).get("confidence", 0.95)):
            item["confidence"] = row.confidence
        rows.setdefault(row.gate_number, []).append(item)
    for gate in document.get("gates", []):
        gate["criteria"] = rows.get(gate["number"], [])
    return validate_plan(document, source=f"{version.pilot.name} plan v{version.number}")


def document_without_criteria(plan: Plan) -> dict[str, Any]:
    data = plan.to_dict()
    for gate in data["gates"]:
        gate.pop("criteria")
        gate["weeks"] = list(gate["weeks"])
        gate["arms"] = list(gate["arms"])
    return data


# ── What a threshold may be, for its unit (the plan page checks it; docs/plan-format.md) ────────────────────────
# Metrics whose value is a share of something (a ratio in [0, 1]).
SHARE_METRICS = frozenset({"hit_ratio", "external_hit_ratio", "error_rate", "output_match", "gpu_model_match",
                           "versions_recorded", "fx_mounted_writable", "capacity_agreement", "goodput"})


@dataclass(frozen=True)
class ThresholdRange:
    """kind: `ratio` (a share, [0, 1]), `change` (gain, drift, reduction: a fraction from −1 up), `spread` (a CV, ≥ 0),
    `speedup` (> 0), `count` (a whole number ≥ 0), `amount` (≥ 0, in the unit). `percent`: the page shows and takes
    it in percent (stored as the fraction)."""

    kind: str
    low: float
    high: float | None
    low_open: bool = False
    whole: bool = False
    percent: bool = False

    def problem(self, value: float) -> str | None:
        """None when `value` (as stored) fits, else the kind of the range it misses."""
        if value != value or value in (float("inf"), float("-inf")):
            return self.kind
        if value < self.low or (self.low_open and value == self.low) or (self.high is not None and value > self.high):
            return self.kind
        if self.whole and value != int(value):
            return self.kind
        return None


def threshold_range(metric: str, statistic: str, comparison: str, unit: str) -> ThresholdRange:
    percent = unit == "fraction"
    if statistic == "count":
        return ThresholdRange("count", 0, None, whole=True)
    if comparison == "speedup":
        return ThresholdRange("speedup", 0, None, low_open=True)
    if comparison in ("gain", "drift", "reduction"):
        return ThresholdRange("change", -1, 1 if comparison == "reduction" else None, percent=percent)
    if statistic == "cv":
        return ThresholdRange("spread", 0, None, percent=percent)
    if metric in SHARE_METRICS:
        return ThresholdRange("ratio", 0, 1, percent=percent)
    if metric == "gpu_count" or unit == "GPUs":
        return ThresholdRange("count", 0, None, whole=True)
    return ThresholdRange("amount", 0, None, percent=percent)
