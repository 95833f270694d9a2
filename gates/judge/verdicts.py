"""From validated inputs and a plan to the `fxpilot.verdict/1` dict (docs/contracts.md §4)."""
from __future__ import annotations

import json
import math
import operator
from typing import Any

import numpy as np

from gates.judge import bootstrap, counters, explain, intervals, sequential, tiers, validity
from gates.judge.lazy import pd
from gates.judge.metrics import (
    CELL,
    INVENTORY_ONLY,
    METRIC_UNITS,
    PROPORTIONS,
    REPETITION_METRICS,
    TIMING_METRICS,
    cell_table,
    decide_version,
    derive,
    inventory_metric,
    request_values,
    rocm_text,
    throughput,
    ttft_distribution,
    version_number,
    version_threshold,
    version_tuple,
)
from gates.judge.records import Inputs, load_inputs
from gates.plan import CriterionSpec, Plan
from gates.traces import capacity
from gates.traces.analysis import LITTLE_REUSE

VERDICT_SCHEMA = "fxpilot.verdict/1"
# 2: t-intervals over repetitions, exact rate bounds, χ² CV interval, soak drift without warm-up, alpha spending
# over extensions, content duplicates, per-GPU models and RDMA port state (docs/judge.md, "Versions")
# 3: planned looks with a group-sequential boundary and one error budget per gate, the session as the unit of
# hit ratios (exact bound), a throughput one request cannot move, completeness, near-copies and clock checks
# 4: read_bw only from retrievals logged with a bandwidth and attributed to the arm's own tier (check
# read-bw-measured: LMCache versions that log no bandwidth, or unattributed retrievals, make it invalid)
# 5: G4's replay judged on the strata where the tier can help (the plan's workloads.replay.strata) with the mix
# stated, goodput criteria, the replay's fidelity to its trace's reuse (replay-reached-trace-reuse), the capacity
# check at pilot scale (capacity_agreement, capacity-check-measured), little reuse never a fail (issue 24)
# 6: tier attribution (tier-bytes-match, dram-cleared, tier_shares, read_bw_windows), the hash and LMCache build as
# observed (chunk-hash-shared, lmcache-fingerprint), open-loop schedule-kept, in-flight labels keyed on the cap,
# criteria that report without gating, the soak drift on the named quantile with each window's sampling error
JUDGE_VERSION = "6"
EXTENSION_ALPHA_SHARE = 0.2   # share of α kept for the extensions of a marginal run
METHODS = {
    "timing": "t-interval over per-repetition statistics on the log scale (repetitions are the independent units)",
    "comparison": "Welch t-interval of the log ratio of two arms' per-repetition statistics",
    "cv": "χ² interval of the coefficient of variation over repetitions",
    "rate": "Clopper–Pearson exact bounds; a zero bar or statistic 'count' is an observed count",
    "drift": "Welch t-interval, late against early steady soak windows (warm-up windows left out), log scale",
    "proportion": "t-interval over per-repetition means (over requests with one repetition)",
    "read_bw": "distribution-free order-statistic interval of the quantile over retrievals",
    "inventory": "recorded facts per node, no interval; versions compared as version tuples",
}
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


def _same_outputs(candidate: frozenset | None, baseline: frozenset | None) -> bool:
    """Both arms answered the session's turns with the same output hashes (a missing hash never matches)."""
    return candidate is not None and candidate == baseline and all(not key.endswith("\0") for key in candidate)


class Design:
    """The group-sequential design a gate's evaluation belongs to (gates.judge.sequential): the looks (repetitions
    at which the judge may decide), which look these records reach, and which run of the gate this is."""

    def __init__(self, plan: Plan, gate_number: int, planned: int | None = None, prior_runs: int = 0):
        self.plan = plan
        self.looks = gate_looks(plan, gate_number, planned)
        self.runs = int(plan.judging.get("runs", sequential.DEFAULT_RUNS))
        self.rerun_share = float(plan.judging.get("rerun_alpha_share", sequential.DEFAULT_RERUN_SHARE))
        self.run = int(prior_runs) + 1
        self.look = len(self.looks)

    def base_confidence(self, spec: CriterionSpec) -> float:
        if spec.confidence is not None:
            return spec.confidence
        if spec.metric == "error_rate" and "rate_confidence" in self.plan.judging:
            return float(self.plan.judging["rate_confidence"])
        return self.plan.confidence

    def alpha(self, confidence: float) -> float:
        """One-sided error this run may spend over its looks."""
        return sequential.run_alpha((1.0 - confidence) / 2.0, self.run, self.runs, self.rerun_share)

    def confidence(self, spec: CriterionSpec) -> float:
        """The two-sided level of this look's intervals: the nominal level of the group-sequential boundary."""
        return self.level(self.base_confidence(spec))

    def level(self, confidence: float) -> float:
        alpha = self.alpha(confidence)
        if alpha <= 0:
            return 1.0
        return sequential.nominal_levels(self.looks, alpha)[max(self.look, 1) - 1]

    def describe(self, repetitions: int) -> dict:
        alpha = (1.0 - self.plan.confidence) / 2.0
        run_alpha = self.alpha(self.plan.confidence)
        earlier = sum(sequential.run_alpha(alpha, r, self.runs, self.rerun_share) for r in range(1, self.run))
        return {"looks": list(self.looks), "look": self.look, "of": len(self.looks),
                "repetitions_judged": self.looks[self.look - 1] if self.look else 0, "repetitions": repetitions,
                "final": self.look == len(self.looks), "run": self.run, "runs": self.runs,
                "alpha": num(alpha), "alpha_run": num(run_alpha),
                "alpha_spent": num(earlier + sequential.spent(self.looks, self.look, run_alpha)),
                "confidence": num(self.level(self.plan.confidence)),
                "boundary": "Lan–DeMets O'Brien–Fleming-type alpha spending, one-sided error per cell "
                            f"≤ {num(alpha)} over all looks and runs"}


class _Judge:
    def __init__(self, plan: Plan, inputs: Inputs, frame: pd.DataFrame, expect: dict, design: Design):
        self.plan, self.inputs, self.frame, self.expect, self.design = plan, inputs, frame, expect, design
        self.seed = int(plan.judging.get("seed", 0))
        self.oracle = replay_oracle(inputs)

    def stratified(self, spec: CriterionSpec, rows: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
        """A replay criterion's requests in the strata where the tier can help (the plan's `workloads.replay.strata`,
        default shared_prefix and returning), when the records carry their stratum; and what was kept, with the
        mix of every stratum the replay sent (docs/judge.md, "Strata and goodput")."""
        if spec.phase != "replay" or rows is None or "stratum" not in rows or not rows["stratum"].notna().any():
            return rows, {}
        judged = judged_strata(self.plan)
        counts = rows["stratum"].fillna("unstratified").value_counts()
        mix = {str(name): int(counts.get(name, 0)) for name in sorted(counts.index)}
        return rows[rows["stratum"].isin(judged)], {"strata": list(judged), "mix": mix}

    def confidence(self, spec: CriterionSpec) -> float:
        """The level of this look (docs/judge.md, "Planned looks")."""
        return self.design.confidence(spec)

    # -- per-repetition statistics: the repetitions are the independent units --
    def per_repetition(self, spec: CriterionSpec, rows: pd.DataFrame, statistic: str | None = None
                       ) -> tuple[np.ndarray, int]:
        """The criterion's statistic of each repetition (sorted by repetition) and the request count."""
        statistic = statistic or spec.statistic
        values = []
        for _, sub in rows.groupby("repetition", sort=True):
            if spec.metric in REPETITION_METRICS:
                values.append(throughput(sub))
                continue
            sample = request_values(sub, spec.metric)
            if len(sample) == 0:
                continue
            per_rep = "p50" if statistic == "cv" and spec.metric == "ttft" else (
                "mean" if statistic in ("cv", "value", "count") else statistic)
            values.append(bootstrap.point(sample, per_rep))
        return np.array(values, dtype=np.float64), int(len(rows))

    def cells(self, spec: CriterionSpec) -> list[dict]:
        if spec.metric in INVENTORY_ONLY:
            return self.inventory_cells(spec)
        if spec.metric == "read_bw":
            return [self.read_bw_cell(spec)]
        if spec.metric == "output_match":
            return [self.output_match_cell(spec)]
        if spec.metric == "external_hit_ratio":
            return self.external_hit_cells(spec)
        if spec.metric == "capacity_agreement":
            return [self.capacity_cell(spec)]
        candidate_rows, strata = self.stratified(spec, validity.select(self.frame, spec.candidate, spec.phase))
        baseline_rows = (self.stratified(spec, validity.select(self.frame, spec.baseline, spec.phase))[0]
                         if spec.baseline else None)
        cells = self._level_cells(spec, candidate_rows, baseline_rows)
        if strata:
            cells = [{**cell, **strata} for cell in cells]
        if spec.phase in validity.OPEN_LOOP_PHASES:
            cells = [self.with_in_flight(spec, cell) for cell in cells]
        return cells

    def in_flight(self, arm: str, phase: str, level: int | None) -> dict | None:
        """Requests in flight as measured (issue 44, item 5): the phase summaries' `in_flight` {max, mean} (the
        most over its repetitions, the mean of their means), else the records' measured most in flight, else the
        summaries' max_in_flight; `cap` is the client's cap the cell is keyed on."""
        summaries = [s for s in self.inputs.summaries if s["arm"] == arm and s["phase"] == phase
                     and (level is None or int(s["concurrency"]) == int(level))]
        measured = [s["in_flight"] for s in summaries if isinstance(s.get("in_flight"), dict)
                    and isinstance(s["in_flight"].get("max"), (int, float))]
        if measured:
            means = [float(m["mean"]) for m in measured if isinstance(m.get("mean"), (int, float))]
            return {"max": num(max(float(m["max"]) for m in measured)), "mean": num(np.mean(means)) if means else None,
                    "cap": level, "source": "phase summaries' in_flight"}
        rows = validity.select(self.frame, arm, phase)
        if level is not None:
            rows = rows[rows["concurrency"] == level]
        column = self.inputs.requests.loc[rows.index, "_in_flight_max"] if "_in_flight_max" in self.inputs.requests \
            else None
        if column is not None and column.notna().any():
            return {"max": num(float(column.max())), "mean": None, "cap": level,
                    "source": "records' measured concurrency"}
        peaks = [s["max_in_flight"] for s in summaries if isinstance(s.get("max_in_flight"), int)]
        if peaks:
            return {"max": max(peaks), "mean": None, "cap": level, "source": "phase summaries' max_in_flight"}
        return None

    def with_in_flight(self, spec: CriterionSpec, cell: dict) -> dict:
        level = cell.get("concurrency")
        found = self.in_flight(spec.candidate, spec.phase, level) if spec.candidate else None
        if found is None:
            return cell
        cell = {**cell, "in_flight": found}
        if spec.baseline:
            base = self.in_flight(spec.baseline, spec.phase, level)
            if base is not None:
                cell["in_flight_baseline"] = base
        return cell

    def _level_cells(self, spec: CriterionSpec, candidate_rows: pd.DataFrame,
                     baseline_rows: pd.DataFrame | None) -> list[dict]:
        out = []
        if validity.pooled_rate(spec):  # a rate bar over every level: one count of requests and failures
            return [self.absolute_cell(spec, candidate_rows, None)]
        for level in validity.levels(spec, self.frame):
            cand = candidate_rows[candidate_rows["concurrency"] == level]
            if spec.comparison == "drift":
                out.append(self.drift_cell(spec, cand, level))
            elif spec.baseline and spec.comparison != "absolute":
                out.append(self.comparison_cell(spec, cand, baseline_rows[baseline_rows["concurrency"] == level], level))
            else:
                out.append(self.absolute_cell(spec, cand, level))
        return out

    def absolute_cell(self, spec: CriterionSpec, rows: pd.DataFrame, level: int | None) -> dict:
        confidence = self.confidence(spec)
        cell: dict[str, Any] = {"concurrency": level}
        if spec.metric == "error_rate":
            failures, n = int(rows["failed"].sum()), int(len(rows))
            cell.update(n_candidate=n, failures=failures, method="exact count" if _counted(spec) else "Clopper–Pearson")
            if _counted(spec):  # an observed count: a fact, no interval
                value = float(failures) if spec.statistic == "count" else (failures / n if n else math.nan)
                return self.finish(spec, cell, value, value, value)
            rate, low, high = intervals.clopper_pearson(failures, n, confidence)
            needed = intervals.error_free_needed(spec.threshold, confidence) if spec.op in ("<=", "<") else None
            if needed is not None:
                cell["error_free_needed"] = needed
            # what the count proves: the rate the exact bound excludes ("0 of 1,344 shows ≤ 0.27 %")
            cell["shows"] = (f"{failures:,} of {n:,} shows ≤ {float(high) * 100:.2g} %" if spec.op in ("<=", "<")
                             else f"{failures:,} of {n:,} shows ≥ {float(low) * 100:.2g} %")
            return self.finish(spec, cell, float(rate), float(low), float(high))
        if spec.metric == "hit_ratio":
            return self.session_hit_cell(spec, rows, cell, confidence)
        if spec.metric == "goodput":
            cell["objectives"] = goodput_objectives(self.plan)
            return self.session_hit_cell(spec, rows, cell, confidence, column="good")
        values, n = self.per_repetition(spec, rows)
        cell.update(n_candidate=n, repetitions=len(values), per_repetition=[num(v) for v in values])
        if spec.statistic == "cv":
            cell["method"] = "χ² interval of the CV over repetitions"
            value, low, high = intervals.cv_chi2(values, confidence)
        elif spec.metric in TIMING_METRICS:
            cell["method"] = "t-interval over repetitions, log scale"
            value, low, high = intervals.log_t(values, confidence)
        elif len(values) >= 2:
            cell["method"] = "t-interval over repetitions"
            value, low, high = intervals.linear_t(values, confidence)
        else:  # one repetition of a per-request proportion (hit ratio): its requests are the sample
            cell["method"] = "t-interval over requests (one repetition)"
            value, low, high = intervals.linear_t(request_values(rows, spec.metric), confidence)
        if spec.metric in PROPORTIONS:
            low, high = max(float(low), 0.0), min(float(high), 1.0)
        return self.finish(spec, cell, float(value), float(low), float(high))

    def session_hit_cell(self, spec: CriterionSpec, rows: pd.DataFrame, cell: dict, confidence: float,
                         column: str = "hit") -> dict:
        """The session is the unit: a session whose chunks never reach the tier misses every time it returns, so
        its requests are one observation, not many. Each session's hit ratio (mean over its successful requests,
        all repetitions) counts as a share of one session; the bound is Clopper–Pearson's with that (possibly
        fractional) count of hitting sessions: exact when sessions hit or miss whole, conservative otherwise
        (a [0, 1] variable spreads less than a 0/1 one of the same mean). 8 of 8 sessions hitting give a
        95 % lower bound of 0.63, never [0.99, 0.99]."""
        # goodput: every request sent counts (one that failed met no objective); a hit ratio: the successful ones
        ok = rows[rows[column].notna()] if column == "good" else rows[rows["ok"] & rows[column].notna()]
        sessions = self.inputs.requests.loc[ok.index, "session"].astype(str)
        per_session = ok[column].groupby(sessions.to_numpy(), sort=True).mean().to_numpy(dtype=np.float64)
        per_session = np.clip(per_session, 0.0, 1.0)
        k, n = float(per_session.sum()), len(per_session)
        what = "goodput" if column == "good" else "hit ratio"
        cell.update(n_candidate=int(len(rows)), sessions=n, requests=int(len(ok)),
                    repetitions=int(rows["repetition"].nunique()),
                    method=f"exact (Clopper–Pearson) bound over sessions, each session's {what} a share of one")
        if n == 0:
            return self.finish(spec, cell, math.nan, math.nan, math.nan)
        value, low, high = intervals.clopper_pearson(k, n, confidence)
        return self.finish(spec, cell, float(value), float(low), float(high))

    def comparison_cell(self, spec: CriterionSpec, cand: pd.DataFrame, base: pd.DataFrame, level: int) -> dict:
        c_values, c_n = self.per_repetition(spec, cand)
        b_values, b_n = self.per_repetition(spec, base)
        c_point = intervals.log_t(c_values, 0.95)[0] if len(c_values) else math.nan
        b_point = intervals.log_t(b_values, 0.95)[0] if len(b_values) else math.nan
        cell = {"concurrency": level, "candidate_value": num(c_point), "baseline_value": num(b_point),
                "n_candidate": c_n, "n_baseline": b_n, "repetitions": [len(c_values), len(b_values)],
                "method": "Welch t-interval over repetitions, log scale"}
        if len(c_values) == 0 or len(b_values) == 0 or np.any(c_values <= 0) or np.any(b_values <= 0):
            return self.finish(spec, cell, math.nan, math.nan, math.nan)
        ratio, low, high = (float(v) for v in intervals.log_ratio(c_values, b_values, self.confidence(spec)))
        value, low, high = _from_ratio(spec.comparison, ratio, low, high)
        return self.finish(spec, cell, value, low, high)

    def finish(self, spec: CriterionSpec, cell: dict, value: float, low: float, high: float) -> dict:
        cell.update(value=num(value), ci=[num(low), num(high)])
        cell["verdict"] = decide(spec.op, spec.threshold, cell["ci"][0], cell["ci"][1])
        return cell

    def drift_cell(self, spec: CriterionSpec, rows: pd.DataFrame, level: int) -> dict:
        """Late steady windows against early steady windows (warm-up windows left out), each window's statistic the
        one the criterion names (judge version 6 never substitutes another quantile: version 5 took q0.90 for a p99
        criterion when windows were small). Each window's statistic carries its own sampling error, so the spread
        across windows holds both that error and the window-to-window spread, and the Welch interval over windows
        accounts for both (coverage measured request by request: benchmarks/calibration/drift.py); each window's
        own error (order statistics of its requests) is shown. A window too small for the named quantile is
        invalid (validity `repetitions`), never judged on another statistic."""
        warmup = soak_warmup(self.plan)
        windows = sorted(int(w) for w in rows["repetition"].unique())
        steady = windows[warmup:]
        half = len(steady) // 2
        early, late = steady[:half], steady[half:]
        counts = [int(((rows["repetition"] == w) & rows["ok"]).sum()) for w in steady]
        pairs = [self._window_stat(rows[rows["repetition"] == w], spec) for w in steady]
        per_window = np.array([p[0] for p in pairs], dtype=np.float64)
        errors = np.array([p[1] for p in pairs], dtype=np.float64)
        cell = {"concurrency": level, "windows": len(windows), "warmup_windows": min(warmup, len(windows)),
                "early_windows": early, "late_windows": late, "statistic_used": spec.statistic,
                "per_window": [num(v) for v in per_window], "per_window_log_se": [num(v) for v in errors],
                "requests_per_window": counts, "n_candidate": int(sum(counts)),
                "method": "Welch t-interval, late vs early steady windows' named quantile, log scale (each window's "
                          "own sampling error is in the windows' spread; its order-statistic estimate is shown)"}
        if len(early) < 2 or len(late) < 2 or np.any(~(per_window > 0)) or np.any(~np.isfinite(errors)):
            cell.update(first_value=None, last_value=None)
            return self.finish(spec, cell, math.nan, math.nan, math.nan)
        e, lt = per_window[:half], per_window[half:]
        value, low, high = (float(v) for v in intervals.drift_t(e, lt, self.confidence(spec)))
        cell.update(first_value=num(intervals.log_t(e, 0.95)[0]), last_value=num(intervals.log_t(lt, 0.95)[0]),
                    n_first=int(sum(counts[:half])), n_last=int(sum(counts[half:])))
        return self.finish(spec, cell, value, low, high)

    @staticmethod
    def _window_stat(rows: pd.DataFrame, spec: CriterionSpec) -> tuple[float, float]:
        """(the window's statistic, its log-scale sampling error) from its own requests."""
        sample = np.sort(request_values(rows, spec.metric))
        if len(sample) == 0:
            return math.nan, math.inf
        q = bootstrap.QUANTILES.get(spec.statistic)
        if q is not None and 0 < q < 1:
            return bootstrap.point(sample, spec.statistic), intervals.quantile_log_se(sample, q)
        value = bootstrap.point(sample, "mean" if spec.statistic == "value" else spec.statistic)
        if len(sample) < 2 or not value > 0:
            return value, math.inf
        return value, float(np.std(sample, ddof=1) / math.sqrt(len(sample)) / value)

    def read_bw_cell(self, spec: CriterionSpec) -> dict:
        every = self.inputs.retrieves
        if spec.candidate:
            every = every[every["arm"] == spec.candidate]
        rows = validity.bandwidth_retrievals(self.inputs.retrieves, spec.candidate or None)
        if len(rows) == 0:  # check read-bw-measured says why; the criterion is invalid
            cell = {"concurrency": None, "candidate_value": None, "n_candidate": 0, "n_retrievals": int(len(every)),
                    "gpus": 0, "method": "no retrieval of the arm's own tier logged with a bandwidth"}
            return self.finish(spec, cell, math.nan, math.nan, math.nan)
        values = np.sort(rows["gbps"].to_numpy(dtype=np.float64), kind="stable")
        statistic = "mean" if spec.statistic == "value" else spec.statistic
        confidence = self.confidence(spec)
        point = bootstrap.point(values, statistic)
        q = bootstrap.QUANTILES.get(statistic)
        if q is not None and 0 < q < 1:
            low, high = intervals.quantile_order(values, q, confidence)
            method = "order-statistic interval over retrievals"
        else:
            _, low, high = intervals.linear_t(values, confidence)
            method = "t-interval over retrievals"
        cell = {"concurrency": None, "candidate_value": num(point), "n_candidate": len(values),
                "n_retrievals": int(len(every)), "gpus": int(rows["gpu"].nunique()), "method": method}
        return self.finish(spec, cell, point, float(low), float(high))

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
        matched = {s for s in sessions if _same_outputs(cand.get(s), base.get(s))}
        matches = np.array([1.0 if s in matched else 0.0 for s in sessions])
        statistic = "mean" if spec.statistic == "value" else spec.statistic
        cell = {"concurrency": None, "candidate_value": None, "n_candidate": len(sessions),
                "mismatched_sessions": [s for s in sessions if s not in matched][:20]}
        if statistic in ("min", "max"):  # every session matched (or one did): a fact, no interval
            point = bootstrap.point(matches, statistic)
            cell.update(candidate_value=num(point), method="exact (every session compared)")
            return self.finish(spec, cell, point, point, point)
        rate, low, high = intervals.clopper_pearson(int(matches.sum()), len(matches), self.confidence(spec))
        cell.update(candidate_value=num(float(rate)), method="Clopper–Pearson over sessions")
        return self.finish(spec, cell, float(rate), float(low), float(high))

    def external_hit_cells(self, spec: CriterionSpec) -> list[dict]:
        """Per concurrency level: Σ external-tier hit tokens ÷ Σ prompt tokens HBM missed over the candidate's
        phase windows (/metrics deltas, counters.external_hits). One window is a count of tokens, no sample:
        its interval is [value, value]; several give a t-interval over the windows' ratios."""
        windows: dict[int, list[tuple[float, float, int]]] = {}
        for summary in self.inputs.summaries:
            if summary["arm"] != spec.candidate or (spec.phase != "any" and summary["phase"] != spec.phase):
                continue
            if spec.concurrency and summary["concurrency"] not in spec.concurrency:
                continue
            found = counters.external_hits(summary, self.inputs.summaries)
            if found is not None:
                windows.setdefault(int(summary["concurrency"]), []).append((*found, int(summary.get("requests") or 0)))
        if not windows:  # validity says why (external-hits-measured)
            cell = {"concurrency": None, "n_candidate": 0, "windows": 0, "method": "/metrics deltas"}
            return [self.finish(spec, cell, math.nan, math.nan, math.nan)]
        out = []
        for level in sorted(windows):
            rows = windows[level]
            hits, missed = sum(r[0] for r in rows), sum(r[1] for r in rows)
            value = hits / missed
            cell = {"concurrency": level, "n_candidate": int(missed), "windows": len(rows),
                    "external_hit_tokens": num(hits), "requests": sum(r[2] for r in rows),
                    "per_window": [num(r[0] / r[1]) for r in rows]}
            if len(rows) >= 2:
                cell["method"] = "t-interval over /metrics windows"
                _, low, high = intervals.linear_t(np.array([r[0] / r[1] for r in rows]), self.confidence(spec))
                low, high = max(float(low), 0.0), min(float(high), 1.0)
            else:
                cell.update(method="server counters over one window (a count of tokens, no interval)", exact=True)
                low = high = value
            out.append(self.finish(spec, cell, value, low, high))
        return out

    def capacity_cell(self, spec: CriterionSpec) -> dict:
        """G4's capacity check (gates.traces.capacity): the external-tier share of the capped replay's prompt tokens
        (/metrics deltas of its phase, as external_hit_ratio reads them) against the oracle's LRU prediction for
        the capacity configured; the value is |measured − predicted|, the bar the tolerance. Counts of tokens over
        one replay, not samples: no interval. Traffic with little or unknown reuse has nothing to check: marginal,
        said as the traffic (never an FX failure)."""
        check = (self.oracle or {}).get("capacity_check") or {}
        cell: dict[str, Any] = {"concurrency": None, "n_candidate": 0, "exact": True,
                                "method": "/metrics deltas of the capped replay against the LRU oracle at its cap"}
        if not check.get("applicable"):
            cell.update(applicable=False, reason=check.get("reason") or ("reuse-unknown" if self.oracle is None
                                                                         else "no-prediction"),
                        ideal_hit_fraction=num(check.get("ideal_hit_fraction")), value=None, ci=[None, None],
                        verdict="marginal")
            return cell
        hits = queried = 0.0
        windows = 0
        for summary in self.inputs.summaries:
            if summary["arm"] != spec.candidate or summary["phase"] != spec.phase:
                continue
            found = counters.external_hits(summary, self.inputs.summaries)
            if found is not None:
                hits, queried, windows = hits + found[0], queried + found[1], windows + 1
        predicted = float(check["predicted_hit_fraction"])
        # order-faithful (issue 44, item 4): the oracle recomputed on the order the capped replay's records show;
        # an order beyond the tolerance (or records that do not match) is invalid, never "FX would under-deliver"
        order = validity.capacity_order(spec, self.inputs, check)
        faithful = True
        if order is not None:
            faithful = bool(order["faithful"]) and not order["unknown_count"] and not order["missing"]
            cell["order"] = {key: order.get(key) for key in ("basis", "requests", "matched", "missing", "unknown_count",
                                                            "inverted_pairs", "pairs", "inverted_share",
                                                            "order_tolerance", "first_inversion", "faithful")}
            if order.get("predicted_in_order") is not None:
                cell["predicted_oracle_order"] = num(predicted)
                predicted = float(order["predicted_in_order"])
        cell.update(applicable=True, predicted=num(predicted), capacity_tokens=int(check["capacity_tokens"]),
                    capacity_for_share_tokens=int(check["capacity_for_share_tokens"]),
                    fraction=num(check["fraction"]), share=num(check["share"]), windows=windows,
                    ideal_hit_fraction=num(check.get("ideal_hit_fraction")),
                    # the scale the check ran at against the capacity being bought, and what sat above FX
                    buy_capacity_tokens=check.get("buy_capacity_tokens"), scale=num(check.get("scale")),
                    dram_tokens=check.get("dram_tokens"),
                    predicted_dram_hit_fraction=num(check.get("predicted_dram_hit_fraction")),
                    predicted_fx_hit_fraction=num(check.get("predicted_fx_hit_fraction")))
        if not windows:  # validity says why (capacity-check-measured)
            cell.update(measured=None, difference=None, value=None, ci=[None, None], verdict="invalid")
            return cell
        measured = hits / queried
        decided = capacity.judge(num(measured), num(predicted), float(spec.threshold))
        difference = num(decided["difference"])
        cell.update(measured=num(measured), difference=difference, n_candidate=int(queried),
                    external_hit_tokens=num(hits), value=num(abs(difference)), ci=[num(abs(difference))] * 2,
                    verdict=decided["verdict"] if faithful else "invalid")
        return cell

    def inventory_cells(self, spec: CriterionSpec) -> list[dict]:
        out = []
        for inventory in self.inputs.inventories:
            if spec.metric == "rocm_version":
                text = rocm_text(inventory)
                wanted = version_threshold(spec.threshold, self.expect.get("rocm_min"))
                found = version_tuple(text)
                verdict = decide_version(spec.op, found, wanted)
                value = num(version_number(text))
                out.append({"node": inventory["node"], "value": value, "ci": [value, value], "verdict": verdict,
                            "version": text, "compared_as": ".".join(map(str, wanted))})
                continue
            value = inventory_metric(inventory, spec.metric, candidate=spec.candidate, expect=self.expect)
            verdict = decide(spec.op, spec.threshold, num(value), num(value))
            out.append({"node": inventory["node"], "value": num(value), "ci": [num(value), num(value)], "verdict": verdict})
        return out


def _counted(spec: CriterionSpec) -> bool:
    """An error-rate criterion judged as an observed count: `statistic: count`, or a rate bar of zero (no finite
    number of requests shows a rate ≤ 0, so 'zero failed requests' is read as the fact it states)."""
    return spec.statistic == "count" or (spec.threshold <= 0 and spec.op in ("<=", "=="))


def _from_ratio(comparison: str, ratio: float, low: float, high: float) -> tuple[float, float, float]:
    """candidate ÷ baseline and its interval → the comparison's value and interval (monotone maps)."""
    if comparison == "speedup":
        return 1.0 / ratio, 1.0 / high, 1.0 / low
    if comparison == "reduction":
        return 1.0 - ratio, 1.0 - high, 1.0 - low
    return ratio - 1.0, low - 1.0, high - 1.0


def look_confidence(confidence: float, look: int, max_extra: int, share: float) -> float:
    """Alpha spending over the looks at a gate: the first judgement spends (1 − share) of α, each of the
    `max_extra` extensions share ÷ max_extra. By Bonferroni the chance that any look passes a gate whose truth
    sits at its bar stays ≤ α/2 (one side of the two-sided level)."""
    alpha = 1.0 - confidence
    if max_extra <= 0 or share <= 0:
        return confidence
    if look <= 0:
        return 1.0 - alpha * (1.0 - share)
    return 1.0 - alpha * share / max_extra


DEFAULT_STRATA = ("shared_prefix", "returning")   # where a cache tier can help (gates.traces.analysis.STRATA)


def judged_strata(plan: Plan) -> tuple[str, ...]:
    """The strata a replay criterion is judged on: the plan's `workloads.replay.strata`, else where a tier can help."""
    found = (plan.workloads.get("replay") or {}).get("strata")
    return tuple(str(s) for s in found) if found else DEFAULT_STRATA


def goodput_objectives(plan: Plan) -> dict:
    """The replay's service objectives in seconds of the modelled (or real) clock: `ttft_objective_s` and
    `itl_objective_s` (mean time between output tokens after the first) of `workloads.replay`."""
    replay = plan.workloads.get("replay") or {}
    return {"ttft_s": num(replay.get("ttft_objective_s")), "itl_s": num(replay.get("itl_objective_s"))}


def time_scale_of(summaries: list[dict], arm: str, phase: str) -> float:
    """Wall seconds per modelled second of an arm's phase: the simulator's `fxpilot_sim_time_scale` gauge in its
    phase summaries' /metrics (records of a simulated server are wall seconds at that scale), else 1."""
    for summary in summaries:
        if summary["arm"] == arm and summary["phase"] == phase:
            value = (summary.get("metrics_after") or {}).get("fxpilot_sim_time_scale")
            if isinstance(value, (int, float)) and value > 0:
                return float(value)
    return 1.0


def with_goodput(frame: pd.DataFrame, requests: pd.DataFrame, plan: Plan, summaries: list[dict]) -> pd.DataFrame:
    """The working frame with `stratum` (replayed requests) and `good`: 1 when a request answered with its first
    token within the TTFT objective and a mean inter-token time within the ITL objective (each only when the
    plan states it), 0 otherwise — a failed request meets no objective — as the serving benchmarks count goodput."""
    stratum = requests["stratum"] if "stratum" in requests else pd.Series(None, index=requests.index, dtype=object)
    frame = frame.assign(stratum=stratum.reindex(frame.index))
    objectives = goodput_objectives(plan)
    if objectives["ttft_s"] is None and objectives["itl_s"] is None:
        return frame.assign(good=np.nan)
    good = frame["ok"].to_numpy(dtype=bool).copy()
    scale = np.ones(len(frame))
    for (arm, phase), index in frame.groupby(["arm", "phase"], observed=True).groups.items():
        scale[frame.index.get_indexer(index)] = time_scale_of(summaries, str(arm), str(phase))
    if objectives["ttft_s"] is not None:
        good &= np.nan_to_num(frame["ttft"].to_numpy(dtype=np.float64), nan=np.inf) <= objectives["ttft_s"] * scale
    if objectives["itl_s"] is not None:
        first = requests["t_first_token"].reindex(frame.index).to_numpy(dtype=np.float64)
        steps = np.maximum(frame["output_tokens"].to_numpy(dtype=np.float64) - 1, 1)
        itl = (frame["t_end"].to_numpy(dtype=np.float64) - first) / steps
        good &= np.nan_to_num(itl, nan=np.inf) <= objectives["itl_s"] * scale
    return frame.assign(good=good.astype(np.float64))


def replay_oracle(inputs: Inputs) -> dict | None:
    """The oracle of the replayed sample (runners.tracereplay: fxpilot.replay-sample/1), or None. Every replay step
    of a run samples the same trace with the same settings, so their oracles are one; the first is read."""
    for sample in inputs.samples:
        if sample.get("oracle"):
            return sample["oracle"]
    return None


def sample_sizing(inputs: Inputs) -> dict:
    """How the replayed sample was sized against the caches above FX (runners.tracereplay: its `sizing`), or {}."""
    for sample in inputs.samples:
        if isinstance(sample.get("sizing"), dict):
            return sample["sizing"]
    return {}


def little_reuse(oracle: dict | None) -> bool:
    """The replayed traffic has little reuse (below gates.traces.analysis.LITTLE_REUSE of its prompt tokens)."""
    return bool(oracle) and float(oracle.get("ideal_hit_fraction") or 0.0) < LITTLE_REUSE


def soak_warmup(plan: Plan) -> int:
    return int((plan.workloads.get("soak") or {}).get("warmup_windows", 1))

def _criterion(judge: _Judge, spec: CriterionSpec, invalid_reasons: list[str]) -> dict:
    confidence = judge.confidence(spec)
    cells = judge.cells(spec)
    if spec.metric == "rocm_version":
        worst_cell = max(cells, key=lambda c: (SEVERITY[c["verdict"]], -(c["value"] or 0))) if cells else {}
        worst = {"value": worst_cell.get("value"), "ci": [worst_cell.get("value")] * 2,
                 "verdict": worst_cell.get("verdict", "fail"), "n_candidate": len(cells)}
        n = len(cells)
    elif spec.metric in INVENTORY_ONLY:
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
    little = spec.phase in ("replay", "capacity") and little_reuse(judge.oracle)
    if little and verdict == "fail":
        # the tier has nothing to show on traffic that does not come back: the traffic, never an FX failure
        verdict = "marginal"
    sizing = sample_sizing(judge.inputs) if spec.phase == "replay" else {}
    fits = sizing.get("needs_tier") is False and not little
    if fits and verdict == "fail":
        # a sample that fits in HBM + DRAM measures those, not FX (issue 44): the sample, never an FX failure
        verdict = "marginal"
    metric_unit = METRIC_UNITS.get(spec.metric, "")
    english, chinese = explain.explain(spec, worst, cells, verdict, confidence, metric_unit, invalid_reasons)
    if little:
        english, chinese = explain.little_reuse(english, chinese, float(judge.oracle["ideal_hit_fraction"]))
    if fits:
        english, chinese = explain.fits_above_fx(english, chinese, sizing)
    rule_en, rule_zh = explain.rule(verdict, spec.op, spec.threshold, worst.get("ci"), confidence,
                                    exact=spec.metric in INVENTORY_ONLY)
    if spec.metric == "capacity_agreement":
        rule_en, rule_zh = explain.CAPACITY_RULE_EN[verdict], explain.CAPACITY_RULE_ZH[verdict]
    return {
        "key": spec.key, "description": spec.description, "description_zh": spec.description_zh,
        "metric": spec.metric, "statistic": spec.statistic, "comparison": spec.comparison,
        "candidate": spec.candidate, "baseline": spec.baseline, "phase": spec.phase,
        "concurrency": list(spec.concurrency), "op": spec.op, "threshold": num(spec.threshold), "unit": spec.unit,
        "confidence": num(confidence), "verdict": verdict, "value": worst.get("value"), "ci": worst.get("ci"), "n": n,
        "cells": cells, "rule": rule_en, "rule_zh": rule_zh, "explanation": english, "explanation_zh": chinese,
        **({"little_reuse": True} if little else {}),
        **({"sample_fits_above_fx": True} if fits else {}),
        **({"gating": False} if not spec.gating else {}),
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
    """Cold-read bandwidth per GPU read back (GB/s), per arm, from the LMCache retrieval records its own tier served
    with a bandwidth logged (`n`); `retrievals` counts them all."""
    rows = []
    for arm, every in retrieves.groupby("arm", sort=True):
        sub = validity.bandwidth_retrievals(every, None)
        gbps = sub["gbps"].to_numpy(dtype=np.float64)
        row = {"arm": str(arm), "n": len(sub), "retrievals": len(every), "gpus": int(sub["gpu"].nunique())}
        if len(gbps):
            row.update(p50=num(np.quantile(gbps, 0.5)), mean=num(gbps.mean()), min=num(gbps.min()), max=num(gbps.max()))
        else:
            row.update(p50=None, mean=None, min=None, max=None)
        rows.append(row)
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
             expect: dict | None = None, look: int | None = None, planned: int | None = None,
             prior_runs: int = 0) -> dict:
    """Judge one gate of a plan on raw inputs. Raises RecordError on input it cannot use.

    The records' repetitions decide the look (docs/judge.md, "Planned looks"): the last of the design's looks
    they reach, judged on the repetitions up to it at that look's boundary. `planned`: the repetitions the run
    was started with when it set them (its looks are the plan's below it and it); `prior_runs`: how many
    earlier runs of this gate were judged (they share the gate's error budget); `look` forces a look (tests)."""
    gate = plan.gate(gate_number)
    inputs = files_or_frames if isinstance(files_or_frames, Inputs) else load_inputs(files_or_frames)
    inputs, counter_check = counters.reconcile(inputs)
    # retrievals the configuration could not attribute (LMCache's DRAM on), attributed by the device counters
    inputs, attribution = tiers.attribute_retrievals(inputs, {**plan.judging})
    full = with_goodput(derive(inputs.requests), inputs.requests, plan, inputs.summaries)
    validity.require_inputs(gate, inputs, full)
    judging = {"min_requests_per_cell": 8, "min_cell_seconds": 0.0, **plan.judging}
    design = Design(plan, gate.number, int(planned) if planned else None, prior_runs)
    if design.run > design.runs:
        raise ValueError(f"{gate.label} has had {prior_runs} judged run(s); its design allows {design.runs}: the gate "
                         "is decided (docs/judge.md, \"One error budget per gate\")")
    seen = repetitions_seen(gate, full)
    design.look = sequential.look_index(design.looks, seen) if look is None else min(max(int(look), 1),
                                                                                      len(design.looks))
    judged_reps = design.looks[design.look - 1] if design.look else seen
    frame = within_look(gate, full, judged_reps)
    every_summary = inputs.summaries
    summaries = [s for s in inputs.summaries if not (s["phase"] == main_phase(gate)
                                                      and int(s["repetition"]) > judged_reps)]
    inputs = Inputs(requests=inputs.requests, retrieves=inputs.retrieves, summaries=summaries,
                    inventories=inputs.inventories, digests=inputs.digests, kinds=inputs.kinds, samples=inputs.samples)
    judge = _Judge(plan, inputs, frame, {**plan.expect, **(expect or {})}, design)
    checks = validity.check(gate, inputs, frame, judging, warmup_windows=soak_warmup(plan),
                            confidence_of=judge.confidence, final=design.look == len(design.looks),
                            expect=judge.expect)
    checks += [validity.completeness(gate, full, every_summary, design.looks, main_phase(gate), planned=planned),
               validity.near_copies(gate, full, inputs.requests, float(judging.get("copy_tolerance_s", 1e-3)),
                                    every_summary),
               validity.clocks(inputs.requests, inputs.summaries, float(judging.get("clock_tolerance_s", 2.0))),
               counter_check]
    if any(spec.phase == "replay" for spec in gate.criteria):
        checks.append(validity.replay_reached_reuse(gate, inputs, frame, judge.oracle, plan))
    if any(spec.metric == "capacity_agreement" for spec in gate.criteria):
        checks.append(validity.capacity_measured(gate, inputs, judge.oracle))
    failed = [c for c in checks if not c["ok"]]
    reasons = [f"{c['name']}: {c['detail']}" for c in failed]
    criteria = [_criterion(judge, spec, reasons) for spec in gate.criteria]
    if failed:
        verdict = "invalid"
    else:
        # a criterion with `gating: false` is reported beside the others and does not decide the gate
        verdict = max((c["verdict"] for c in criteria if c.get("gating", True)), key=SEVERITY.__getitem__,
                      default="pass")
    english, chinese = explain.gate_explanation(gate.label, verdict, criteria, failed)
    english, chinese = _with_look(english, chinese, design, verdict)
    table = cell_table(frame)
    simulated = bool(inputs.requests["simulated"].any()) if len(inputs.requests) else False
    simulated |= any(validity.summary_simulated(s) for s in inputs.summaries) or any(i["simulated"] for i in inputs.inventories)
    if len(inputs.retrieves):
        simulated |= bool(inputs.retrieves["simulated"].astype(bool).any())
    return {
        "schema": VERDICT_SCHEMA, "gate": gate.number, "verdict": verdict, "plan_sha256": plan.sha256,
        "simulated": simulated, "judge_version": JUDGE_VERSION,
        "bootstrap": {"seed": judge.seed, "confidence": num(plan.confidence),
                      "method": "; ".join(f"{k}: {v}" for k, v in METHODS.items())},
        "sequential": design.describe(seen),
        # kept for readers of judge version 2 (runners.evaluation.extension_history): later looks were extensions
        "extension": {"extensions": max(design.look - 1, 0), "planned_repetitions": design.looks[-1],
                      "repetitions": seen, "max_extra_repetitions": 0,
                      "confidence": num(design.level(plan.confidence))},
        "validity": {"valid": not failed, "checks": checks},
        "criteria": criteria,
        "metrics": _metrics(table),
        "spread": _spread(table),
        "read_bw": _read_bandwidth(inputs.retrieves),
        # judge version 6 (issue 43): per window, the disk tier's device bytes over the window's time (or LMCache's
        # Retrieved lines, saying which), and the share of prompt tokens each tier served
        "read_bw_windows": tiers.read_bw_windows(inputs),
        "read_bw_attribution": attribution,
        "tier_shares": tiers.tier_shares(inputs, frame),
        "distributions": _distributions(frame),
        "inventory": [_public(i) for i in inputs.inventories],
        "inputs": dict(inputs.digests),
        "counts": {"requests": int(len(inputs.requests)),
                   "ok_without_first_token": int(((inputs.requests["status"] == "ok")
                                                  & inputs.requests["t_first_token"].isna()).sum()), "retrievals": int(len(inputs.retrieves)),
                   "phase_summaries": len(inputs.summaries), "inventories": len(inputs.inventories)},
        "explanation": english, "explanation_zh": chinese,
    }


def _with_look(english: str, chinese: str, design: Design, verdict: str) -> tuple[str, str]:
    """The gate's explanation says which look of how many this is and what error has been spent, so the gate page
    and the reports, which show it, say so too."""
    if not design.look:
        return english, chinese
    d = design.describe(0)
    spent, budget = f"{d['alpha_spent'] * 100:.2g} %", f"{d['alpha'] * 100:.2g} %"
    reps = d["repetitions_judged"]
    english += (f" Look {d['look']} of {d['of']} ({reps} repetitions), run {d['run']} of {d['runs']}; error spent "
                f"{spent} of {budget} per cell.")
    chinese += (f"第 {d['look']} 次查看（共 {d['of']} 次，{reps} 次重复），第 {d['run']} 次运行（共 {d['runs']} 次）；"
                f"每个单元已用误差 {spent}（共 {budget}）。")
    if verdict == "marginal" and not d["final"]:
        english += f" Marginal before the last look: the run continues to look {d['look'] + 1}."
        chinese += f"在最后一次查看之前为临界：运行继续到第 {d['look'] + 1} 次查看。"
    return english, chinese


def canonical_json(verdict: dict) -> str:
    """The verdict as bytes-stable JSON: sorted keys, no spaces, UTF-8 text kept."""
    return json.dumps(verdict, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def planned_repetitions(plan: Plan, gate_number: int) -> int:
    """Repetitions the plan's workload asks for in a gate's main phase (its last look)."""
    workload = "replay" if gate_number == 4 else "cold_recovery"
    return int((plan.workloads.get(workload) or {}).get("repetitions", 1))


def gate_looks(plan: Plan, gate_number: int, planned: int | None = None) -> tuple[int, ...]:
    """The repetition counts at which the judge may decide a gate: `judging.looks` for G1–G3 (cold recovery),
    the documented defaults (sequential.default_looks) for a plan without them, one look at the replay's
    repetitions for G4. A run that set its own repetitions (`planned`) looks at the plan's looks below them and
    at them."""
    full = planned_repetitions(plan, gate_number)
    if gate_number == 4:
        return (int(planned or full),)
    looks = tuple(plan.judging.get("looks") or sequential.default_looks(full))
    if planned and planned != looks[-1]:
        looks = tuple(r for r in looks if r < planned) + (int(planned),)
    return looks


def main_phase(gate) -> str:
    return "replay" if gate.number == 4 else "measure"


def within_look(gate, frame: pd.DataFrame, repetitions: int) -> pd.DataFrame:
    """The records a look judges: the gate's main phase up to the look's repetitions (later ones wait for the next
    look), every other phase whole."""
    later = (frame["phase"] == main_phase(gate)) & (frame["repetition"] > repetitions)
    return frame[~later.to_numpy()] if later.any() else frame


def repetitions_seen(gate, frame: pd.DataFrame) -> int:
    """The fewest repetitions of any cell of the gate's main phase (measure; replay for G4): the look the records
    reach is the look every cell reaches (validity.completeness names cells that lag)."""
    counts = [len(reps) for reps in validity.main_cells(gate, frame, main_phase(gate)).values()]
    return min(counts) if counts else 0


def next_look(verdict: dict) -> int | None:
    """The repetitions of the next look of a marginal verdict's design, or None when it was the last look."""
    design = verdict.get("sequential") or {}
    looks, look = design.get("looks") or [], int(design.get("look") or 0)
    if verdict.get("verdict") != "marginal" or not looks or look >= len(looks):
        return None
    return int(looks[look])


def can_extend(verdict: dict, plan: Plan, repetitions_done: int) -> bool:
    """A marginal verdict at a look before the design's last may continue to the next look."""
    wanted = next_look(verdict)
    return wanted is not None and repetitions_done < wanted
