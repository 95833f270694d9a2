"""From validated inputs and a plan to the `fxpilot.verdict/1` dict (docs/contracts.md §4)."""
from __future__ import annotations

import json
import math
import operator
from typing import Any

import numpy as np
import pandas as pd

from gates.judge import bootstrap, explain, validity
from gates.judge.metrics import (
    CELL,
    INVENTORY_ONLY,
    METRIC_UNITS,
    REPETITION_METRICS,
    cell_table,
    derive,
    inventory_metric,
    request_values,
    throughput,
    ttft_distribution,
)
from gates.judge.records import Inputs, load_inputs
from gates.plan import CriterionSpec, Plan

VERDICT_SCHEMA = "fxpilot.verdict/1"
JUDGE_VERSION = "1"
SEVERITY = {"pass": 0, "marginal": 1, "fail": 2, "invalid": 3}
SIGNIFICANT = 6
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


def num(value: Any) -> float | None:
    """Floats rounded to 6 significant digits, so every figure is shown exactly as it was decided."""
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        return None
    return float(f"{value:.{SIGNIFICANT}g}") + 0.0


def decide(op: str, threshold: float, low: float | None, high: float | None) -> str:
    """pass when the whole interval clears the bar, fail when none of it does, marginal otherwise."""
    if low is None or high is None:
        return "marginal"
    if op == "==":
        if low == high == threshold:
            return "pass"
        return "fail" if threshold < low or threshold > high else "marginal"
    clears = _OPS[op]
    worst, best = (low, high) if op in (">=", ">") else (high, low)
    if clears(worst, threshold):
        return "pass"
    return "marginal" if clears(best, threshold) else "fail"


def _margin(op: str, threshold: float, value: float | None) -> float:
    if value is None:
        return -math.inf
    if op in (">=", ">"):
        return value - threshold
    if op in ("<=", "<"):
        return threshold - value
    return -abs(value - threshold)


def _compare(comparison: str, candidate: np.ndarray | float, baseline: np.ndarray | float):
    with np.errstate(divide="ignore", invalid="ignore"):
        if comparison == "speedup":
            return np.divide(baseline, candidate)
        if comparison == "reduction":
            return 1.0 - np.divide(candidate, baseline)
        if comparison in ("gain", "drift"):
            return np.divide(candidate, baseline) - 1.0
    return candidate


def _same_outputs(candidate: frozenset | None, baseline: frozenset | None) -> bool:
    """Both arms answered the session's turns with the same output hashes (a missing hash never matches)."""
    return candidate is not None and candidate == baseline and all(not key.endswith("\0") for key in candidate)


class _Judge:
    def __init__(self, plan: Plan, inputs: Inputs, frame: pd.DataFrame, expect: dict):
        self.plan, self.inputs, self.frame, self.expect = plan, inputs, frame, expect
        self.resamples = int(plan.judging.get("bootstrap_resamples", 1000))
        self.seed = int(plan.judging.get("seed", 0))

    def rng(self, spec: CriterionSpec, level: int | None, role: str) -> np.random.Generator:
        return bootstrap.rng_for(self.seed, spec.key, -1 if level is None else level, role)

    # -- one side of a comparison: (point, replicates, n) --
    def side(self, spec: CriterionSpec, rows: pd.DataFrame, level: int | None, role: str) -> tuple[float, np.ndarray, int]:
        rng = self.rng(spec, level, role)
        if spec.metric in REPETITION_METRICS:
            per_rep = np.array([throughput(sub) for _, sub in rows.groupby("repetition", sort=True)], dtype=np.float64)
            statistic = "mean" if spec.statistic == "value" else spec.statistic
            point = bootstrap.cv(per_rep) if statistic == "cv" else bootstrap.point(per_rep, statistic)
            return point, bootstrap.resample_repetitions(per_rep, statistic, self.resamples, rng), len(per_rep)
        if spec.statistic == "cv":
            # Spread across repetitions: the repetitions are the sample. Requests of one closed-loop repetition
            # are not independent draws (their TTFTs are the places in one queue), so they are not resampled.
            per_rep_stat = "p50" if spec.metric == "ttft" else "mean"
            samples = [request_values(sub, spec.metric) for _, sub in rows.groupby("repetition", sort=True)]
            points = np.array([bootstrap.point(s, per_rep_stat) for s in samples])
            if len(samples) < 2:
                return math.nan, np.full(self.resamples, np.nan), sum(len(s) for s in samples)
            return bootstrap.cv(points), bootstrap.resample_repetitions(points, "cv", self.resamples, rng), \
                sum(len(s) for s in samples)
        values = request_values(rows, spec.metric)
        groups = [request_values(sub, spec.metric) for _, sub in rows.groupby("repetition", sort=True)]
        groups = [g for g in groups if len(g)]
        if len(groups) >= 2:
            replicates = bootstrap.resample_clusters(groups, spec.statistic, self.resamples, rng)
        else:
            replicates = bootstrap.resample(values, spec.statistic, self.resamples, rng)
        return bootstrap.point(values, spec.statistic), replicates, len(values)

    def cells(self, spec: CriterionSpec) -> list[dict]:
        if spec.metric in INVENTORY_ONLY:
            return self.inventory_cells(spec)
        if spec.metric == "read_bw":
            return [self.read_bw_cell(spec)]
        if spec.metric == "output_match":
            return [self.output_match_cell(spec)]
        out = []
        candidate_rows = validity.select(self.frame, spec.candidate, spec.phase)
        baseline_rows = validity.select(self.frame, spec.baseline, spec.phase) if spec.baseline else None
        for level in validity.levels(spec, self.frame):
            cand = candidate_rows[candidate_rows["concurrency"] == level]
            if spec.comparison == "drift":
                out.append(self.drift_cell(spec, cand, level))
                continue
            c_point, c_reps, c_n = self.side(spec, cand, level, "candidate")
            cell = {"concurrency": level, "candidate_value": num(c_point), "n_candidate": c_n}
            if spec.baseline and spec.comparison != "absolute":
                base = baseline_rows[baseline_rows["concurrency"] == level]
                b_point, b_reps, b_n = self.side(spec, base, level, "baseline")
                value, replicates = _compare(spec.comparison, c_point, b_point), _compare(spec.comparison, c_reps, b_reps)
                cell.update(baseline_value=num(b_point), n_baseline=b_n)
            else:
                value, replicates = c_point, c_reps
            out.append(self.finish(spec, cell, value, replicates))
        return out

    def finish(self, spec: CriterionSpec, cell: dict, value: float, replicates: np.ndarray) -> dict:
        low, high = bootstrap.interval(np.asarray(replicates, dtype=np.float64), self.confidence(spec))
        cell.update(value=num(value), ci=[num(low), num(high)])
        cell["verdict"] = decide(spec.op, spec.threshold, cell["ci"][0], cell["ci"][1])
        return cell

    def confidence(self, spec: CriterionSpec) -> float:
        return spec.confidence if spec.confidence is not None else self.plan.confidence

    def drift_cell(self, spec: CriterionSpec, rows: pd.DataFrame, level: int) -> dict:
        windows = sorted(rows["repetition"].unique())
        first_rows = rows[rows["repetition"] == windows[0]] if windows else rows
        last_rows = rows[rows["repetition"] == windows[-1]] if windows else rows
        f_point, f_reps, f_n = self.side(spec, first_rows, level, "first")
        l_point, l_reps, l_n = self.side(spec, last_rows, level, "last")
        cell = {"concurrency": level, "first_value": num(f_point), "last_value": num(l_point), "windows": len(windows),
                "n_first": f_n, "n_last": l_n, "n_candidate": f_n + l_n}
        return self.finish(spec, cell, _compare("drift", l_point, f_point), _compare("drift", l_reps, f_reps))

    def read_bw_cell(self, spec: CriterionSpec) -> dict:
        rows = self.inputs.retrieves
        if spec.candidate:
            rows = rows[rows["arm"] == spec.candidate]
        values = np.sort(rows["gbps"].to_numpy(dtype=np.float64), kind="stable")
        statistic = "mean" if spec.statistic == "value" else spec.statistic
        replicates = bootstrap.resample(values, statistic, self.resamples, self.rng(spec, None, "candidate"))
        cell = {"concurrency": None, "candidate_value": num(bootstrap.point(values, statistic)), "n_candidate": len(values),
                "gpus": int(rows["gpu"].nunique())}
        return self.finish(spec, cell, bootstrap.point(values, statistic), replicates)

    def output_match_cell(self, spec: CriterionSpec) -> dict:
        def outputs(arm: str) -> dict[str, frozenset]:
            rows = validity.select(self.frame, arm, spec.phase)
            rows = self.inputs.requests.loc[rows.index[rows["ok"].to_numpy()]]
            turns = rows["turn"].fillna(-1).astype(np.int64).astype(str)
            keyed = rows["session"].astype(str) + "\0" + turns + "\0" + rows["output_sha256"].fillna("").astype(str)
            out: dict[str, set] = {}
            for session, key in zip(rows["session"].astype(str), keyed, strict=True):
                out.setdefault(session, set()).add(key)
            return {s: frozenset(k) for s, k in out.items()}

        cand, base = outputs(spec.candidate), outputs(spec.baseline)
        sessions = sorted(set(cand) | set(base))
        matched = [s for s in sessions if _same_outputs(cand.get(s), base.get(s))]
        matches = np.sort(np.array([1.0 if _same_outputs(cand.get(s), base.get(s)) else 0.0 for s in sessions]))
        statistic = "mean" if spec.statistic == "value" else spec.statistic
        replicates = bootstrap.resample(matches, statistic, self.resamples, self.rng(spec, None, "sessions"))
        point = bootstrap.point(matches, statistic)
        cell = {"concurrency": None, "candidate_value": num(point), "n_candidate": len(sessions),
                "mismatched_sessions": [s for s in sessions if s not in set(matched)][:20]}
        return self.finish(spec, cell, point, replicates)

    def inventory_cells(self, spec: CriterionSpec) -> list[dict]:
        out = []
        for inventory in self.inputs.inventories:
            value = inventory_metric(inventory, spec.metric, candidate=spec.candidate, expect=self.expect)
            verdict = decide(spec.op, spec.threshold, num(value), num(value))
            out.append({"node": inventory["node"], "value": num(value), "ci": [num(value), num(value)], "verdict": verdict})
        return out


def _criterion(judge: _Judge, spec: CriterionSpec, invalid_reasons: list[str]) -> dict:
    confidence = judge.confidence(spec)
    cells = judge.cells(spec)
    if spec.metric in INVENTORY_ONLY:
        values = np.array([c["value"] for c in cells], dtype=np.float64)
        statistic = "min" if spec.statistic == "value" else spec.statistic
        value = num(bootstrap.point(values, statistic))
        worst = {"value": value, "ci": [value, value], "verdict": decide(spec.op, spec.threshold, value, value),
                 "n_candidate": len(cells)}
        n = len(cells)
    else:
        positions = {id(c): i for i, c in enumerate(cells)}
        worst = min(cells, key=lambda c: (-SEVERITY[c["verdict"]], _margin(spec.op, spec.threshold, c.get("value")),
                                          positions[id(c)])) if cells else {"value": None, "ci": [None, None],
                                                                            "verdict": "marginal"}
        n = int(worst.get("n_candidate", 0)) + int(worst.get("n_baseline", 0))
    verdict = "invalid" if invalid_reasons else worst["verdict"]
    metric_unit = METRIC_UNITS.get(spec.metric, "")
    english, chinese = explain.explain(spec, worst, cells, verdict, confidence, metric_unit, invalid_reasons)
    rule_en, rule_zh = explain.rule(verdict, spec.op, spec.threshold, worst.get("ci"), confidence,
                                    exact=spec.metric in INVENTORY_ONLY)
    return {
        "key": spec.key, "description": spec.description, "description_zh": spec.description_zh,
        "metric": spec.metric, "statistic": spec.statistic, "comparison": spec.comparison,
        "candidate": spec.candidate, "baseline": spec.baseline, "phase": spec.phase,
        "concurrency": list(spec.concurrency), "op": spec.op, "threshold": num(spec.threshold), "unit": spec.unit,
        "confidence": num(confidence), "verdict": verdict, "value": worst.get("value"), "ci": worst.get("ci"), "n": n,
        "cells": cells, "rule": rule_en, "rule_zh": rule_zh, "explanation": english, "explanation_zh": chinese,
    }


def _metrics(table: pd.DataFrame) -> list[dict]:
    rows = []
    for record in table.to_dict("records"):
        row = {key: (record[key] if key in CELL else num(record[key])) for key in record}
        row["concurrency"], row["repetition"] = int(record["concurrency"]), int(record["repetition"])
        row["n"], row["n_ok"] = int(record["n"]), int(record["n_ok"])
        rows.append(row)
    return rows


def _spread(table: pd.DataFrame) -> list[dict]:
    """Across repetitions, per arm × phase × concurrency: how much TTFT p50 and throughput varied (CV)."""
    rows = []
    for (arm, phase, level), cells in table.groupby(["arm", "phase", "concurrency"], sort=True, observed=True):
        rows.append({"arm": str(arm), "phase": str(phase), "concurrency": int(level), "repetitions": len(cells),
                     "ttft_p50_cv": num(bootstrap.cv(cells["ttft_p50"].to_numpy(dtype=np.float64))),
                     "throughput_cv": num(bootstrap.cv(cells["throughput"].to_numpy(dtype=np.float64)))})
    return rows


def _read_bandwidth(retrieves: pd.DataFrame) -> list[dict]:
    """Cold-read bandwidth per GPU read back (GB/s), per arm, from the LMCache retrieval records."""
    rows = []
    for arm, sub in retrieves.groupby("arm", sort=True):
        gbps = sub["gbps"].to_numpy(dtype=np.float64)
        rows.append({"arm": str(arm), "n": len(sub), "gpus": int(sub["gpu"].nunique()),
                     "p50": num(np.quantile(gbps, 0.5)), "mean": num(gbps.mean()), "min": num(gbps.min()),
                     "max": num(gbps.max())})
    return rows


def _distributions(frame: pd.DataFrame) -> dict[str, list]:
    out = {}
    rows = frame[frame["ok"] & frame["ttft"].notna() & (frame["phase"] != "populate")]
    for (arm, phase, level), sub in rows.groupby(["arm", "phase", "concurrency"], sort=True, observed=True):
        key = f"{arm}@{level}" if phase == "measure" else f"{arm}@{level}/{phase}"
        out[key] = [num(v) for v in ttft_distribution(np.sort(sub["ttft"].to_numpy()))]
    return out


def _public(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


def evaluate(plan: Plan, gate_number: int | str, files_or_frames: Inputs | list | tuple, *,
             expect: dict | None = None) -> dict:
    """Judge one gate of a plan on raw inputs. Raises RecordError on input it cannot use."""
    gate = plan.gate(gate_number)
    inputs = files_or_frames if isinstance(files_or_frames, Inputs) else load_inputs(files_or_frames)
    frame = derive(inputs.requests)
    validity.require_inputs(gate, inputs, frame)
    judging = {"min_requests_per_cell": 8, "min_cell_seconds": 0.0, **plan.judging}
    checks = validity.check(gate, inputs, frame, judging)
    failed = [c for c in checks if not c["ok"]]
    reasons = [f"{c['name']}: {c['detail']}" for c in failed]
    judge = _Judge(plan, inputs, frame, {**plan.expect, **(expect or {})})
    criteria = [_criterion(judge, spec, reasons) for spec in gate.criteria]
    if failed:
        verdict = "invalid"
    else:
        verdict = max((c["verdict"] for c in criteria), key=SEVERITY.__getitem__)
    english, chinese = explain.gate_explanation(gate.label, verdict, criteria, failed)
    table = cell_table(frame)
    simulated = bool(inputs.requests["simulated"].any()) if len(inputs.requests) else False
    simulated |= any(s["simulated"] for s in inputs.summaries) or any(i["simulated"] for i in inputs.inventories)
    if len(inputs.retrieves):
        simulated |= bool(inputs.retrieves["simulated"].astype(bool).any())
    return {
        "schema": VERDICT_SCHEMA, "gate": gate.number, "verdict": verdict, "plan_sha256": plan.sha256,
        "simulated": simulated, "judge_version": JUDGE_VERSION,
        "bootstrap": {"resamples": judge.resamples, "seed": judge.seed, "confidence": num(plan.confidence),
                      "method": "percentile; requests resampled within each arm's cell, throughput by repetition"},
        "validity": {"valid": not failed, "checks": checks},
        "criteria": criteria,
        "metrics": _metrics(table),
        "spread": _spread(table),
        "read_bw": _read_bandwidth(inputs.retrieves),
        "distributions": _distributions(frame),
        "inventory": [_public(i) for i in inputs.inventories],
        "inputs": dict(inputs.digests),
        "counts": {"requests": int(len(inputs.requests)), "retrievals": int(len(inputs.retrieves)),
                   "phase_summaries": len(inputs.summaries), "inventories": len(inputs.inventories)},
        "explanation": english, "explanation_zh": chinese,
    }


def canonical_json(verdict: dict) -> str:
    """The verdict as bytes-stable JSON: sorted keys, no spaces, UTF-8 text kept."""
    return json.dumps(verdict, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def planned_repetitions(plan: Plan, gate_number: int) -> int:
    """Repetitions the plan's workload asks for in a gate's main phase."""
    workload = "replay" if gate_number == 4 else "cold_recovery"
    return int((plan.workloads.get(workload) or {}).get("repetitions", 1))


def can_extend(verdict: dict, plan: Plan, repetitions_done: int) -> bool:
    """A marginal run may get more repetitions until planned + judging.max_extra_repetitions are done."""
    if verdict.get("verdict") != "marginal":
        return False
    cap = planned_repetitions(plan, int(verdict["gate"])) + int(plan.judging.get("max_extra_repetitions", 0))
    return repetitions_done < cap
