"""Hand-computed cases for each statistic, comparison and interval method (docs/judge.md)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from gates.judge import evaluate
from gates.judge.verdicts import decide
from tests.judge.helpers import inventory_file, jsonl, plan_with, request, summaries_file

LEVEL = 0.95  # one look at the records' repetitions, one run: the plan's level (judge_one)


def judge_one(criterion: dict, records: list[dict], *extra_files, gate: int = 3, **judging) -> dict:
    plan = plan_with([criterion], gate=gate, **{"min_requests_per_cell": 1, **judging})
    files = [("records.jsonl", jsonl(records)), summaries_file(records), inventory_file(), *extra_files]
    main = [r["repetition"] for r in records if r["phase"] in ("measure", "replay")]
    # one look at the records' own repetitions (a run that set them), one run: intervals at the plan's level
    verdict = evaluate(plan, gate, files, planned=max(main) if main else None)
    assert verdict["validity"]["valid"], verdict["validity"]
    return verdict["criteria"][0]


def reps_of(arm: str, per_rep: list[list[float]], **kw) -> list[dict]:
    """Records of one arm: repetition r has the TTFTs per_rep[r − 1]."""
    out = []
    for rep, ttfts in enumerate(per_rep, start=1):
        out += [request(arm, t, t_send=1000.0 * rep + 10.0 * i, repetition=rep, session=f"{arm}-r{rep}-s{i}", **kw)
                for i, t in enumerate(ttfts)]
    return out


def t_half(logs: list[float], level: float = LEVEL) -> float:
    return stats.t.ppf(1 - (1 - level) / 2, len(logs) - 1) * np.std(logs, ddof=1) / math.sqrt(len(logs))


FX = [[4.0] * 8, [9.0] * 8]        # per-repetition p50 4 and 9: geometric mean 6
LOCAL = [[8.0] * 8, [18.0] * 8]    # 8 and 18: geometric mean 12


def test_speedup_is_baseline_over_candidate_with_welch_on_the_log_scale():
    c = judge_one({"key": "k", "metric": "ttft", "statistic": "p50", "comparison": "speedup", "candidate": "fx",
                   "baseline": "local_nvme", "threshold": 1.5}, reps_of("fx", FX) + reps_of("local_nvme", LOCAL))
    cell = c["cells"][0]
    assert (c["value"], cell["candidate_value"], cell["baseline_value"]) == (2.0, 6.0, 12.0)
    # equal variances of two repetitions each: se² = 2 · var/2, Welch's df = 2
    var = np.var(np.log([4.0, 9.0]), ddof=1)
    half = stats.t.ppf(0.975, 2) * math.sqrt(var)
    assert c["ci"] == pytest.approx([2.0 * math.exp(-half), 2.0 * math.exp(half)], rel=1e-5)
    assert c["confidence"] == LEVEL and c["n"] == 32 and cell["repetitions"] == [2, 2]


def test_reduction_is_one_minus_candidate_over_baseline():
    c = judge_one({"key": "k", "metric": "ttft", "statistic": "p50", "comparison": "reduction", "candidate": "fx",
                   "baseline": "local_nvme", "threshold": 0.2}, reps_of("fx", FX) + reps_of("local_nvme", LOCAL))
    assert c["value"] == 0.5


@pytest.mark.parametrize(("statistic", "expected"), [("p50", 4.5), ("p90", 7.3), ("p99", 7.93), ("mean", 4.5),
                                                     ("min", 1.0), ("max", 8.0)])
def test_absolute_statistics_are_geometric_means_of_per_repetition_linear_quantiles(statistic, expected):
    one = [1, 2, 3, 4, 5, 6, 7, 8]
    c = judge_one({"key": "k", "metric": "ttft", "statistic": statistic, "comparison": "absolute", "candidate": "fx",
                   "threshold": 0}, reps_of("fx", [one, [2 * v for v in one]]))
    assert c["value"] == pytest.approx(expected * math.sqrt(2), rel=1e-5)
    logs = np.log([expected, 2 * expected])
    assert c["ci"][1] == pytest.approx(math.exp(logs.mean() + t_half(list(logs))), rel=1e-5)


def test_gain_compares_throughput_of_each_cell_over_repetitions():
    records = []
    for rep, (fx_span, local_span) in enumerate(((5.0, 10.0), (4.0, 10.0)), start=1):
        base = 10_000.0 * rep
        records += [request("fx", 1.0, t_send=base + fx_span * i, t_end=base + fx_span * (i + 1), output_tokens=10,
                            repetition=rep, session=f"f{rep}-{i}") for i in range(8)]
        # (the second local repetition's TTFTs differ, or it would be a copy of the first: no-copied-repetitions)
        records += [request("local_nvme", 1.0 + 0.1 * (rep - 1), t_send=base + 5000 + local_span * i,
                            t_end=base + 5000 + local_span * (i + 1),
                            output_tokens=10, repetition=rep, session=f"l{rep}-{i}") for i in range(8)]
    c = judge_one({"key": "k", "metric": "throughput", "statistic": "mean", "comparison": "gain", "candidate": "fx",
                   "baseline": "local_nvme", "threshold": 0.2}, records)
    # fx: 2 and 2.5 tok/s, local: 1 and 1 tok/s — gain = geometric mean 2.236 / 1 − 1
    assert c["cells"][0]["candidate_value"] == pytest.approx(math.sqrt(5), rel=1e-5)
    assert c["value"] == pytest.approx(math.sqrt(5) - 1, rel=1e-5) and c["verdict"] == "marginal"


def test_cv_is_the_spread_of_per_repetition_medians_with_a_chi_square_interval():
    records = []
    for rep, centre in ((1, 10.0), (2, 12.0), (3, 14.0)):
        records += [request("recompute", centre + d, t_send=100.0 * rep + i, repetition=rep, session=f"s{rep}-{i}")
                    for i, d in enumerate((-1.0, 0.0, 1.0))]
    c = judge_one({"key": "k", "metric": "ttft", "statistic": "cv", "comparison": "absolute", "candidate": "recompute",
                   "op": "<=", "threshold": 0.5}, records)
    cv = 2.0 / 12.0  # sample std of (10, 12, 14) = 2, mean 12
    assert c["value"] == pytest.approx(cv, rel=1e-5)
    assert c["ci"] == pytest.approx([cv * math.sqrt(2 / stats.chi2.ppf(0.975, 2)),
                                     cv * math.sqrt(2 / stats.chi2.ppf(0.025, 2))], rel=1e-5)
    assert c["verdict"] == "marginal"  # 0.167 × 7.0: three repetitions cannot show ≤ 50 %


def test_error_rate_uses_exact_bounds():
    records = reps_of("fx", [[1.0] * 8]) + [request("fx", None, t_send=200.0 + i, session=f"e{i}", status="error")
                                            for i in range(2)]
    c = judge_one({"key": "k", "metric": "error_rate", "statistic": "value", "comparison": "absolute",
                   "candidate": "fx", "op": "<=", "threshold": 0.5}, records)
    low, high = stats.beta.ppf(0.025, 2, 9), stats.beta.ppf(0.975, 3, 8)
    assert c["value"] == 0.2 and c["ci"] == pytest.approx([low, high], rel=1e-5) and c["n"] == 10
    assert c["verdict"] == "marginal" and c["cells"][0]["method"] == "Clopper–Pearson"


def test_a_zero_bar_on_failures_is_an_observed_count():
    records = reps_of("fx", [[1.0] * 8])
    spec = {"key": "k", "metric": "error_rate", "statistic": "count", "comparison": "absolute", "candidate": "fx",
            "op": "<=", "threshold": 0}
    assert judge_one(spec, records)["verdict"] == "pass"
    failed = records + [request("fx", None, t_send=500.0, session="e", status="error")]
    c = judge_one(spec, failed)
    assert (c["value"], c["verdict"]) == (1.0, "fail") and "1 failed request(s) of 9" in c["explanation"]


def test_hit_ratio_is_an_exact_bound_over_sessions():
    """Each session's hit ratio is a share of one session; Clopper–Pearson with that count (judge version 3)."""
    records = [request("fx", 1.0, t_send=i, session=f"s{i}", prompt_tokens=100, cached_tokens=50 if i % 2 else 100)
               for i in range(8)]
    c = judge_one({"key": "k", "metric": "hit_ratio", "statistic": "mean", "comparison": "absolute",
                   "candidate": "fx", "threshold": 0.95}, records)
    low, high = stats.beta.ppf(0.025, 6, 3), stats.beta.ppf(0.975, 7, 2)  # 6 of 8 sessions' worth of hits
    assert c["value"] == 0.75 and c["ci"] == pytest.approx([low, high], rel=1e-5)
    assert c["cells"][0]["sessions"] == 8 and c["verdict"] == "marginal"
    # the same session in two repetitions is one unit: its misses are not new evidence
    again = records + [dict(r, repetition=2, t_send=r["t_send"] + 100.0, t_first_token=r["t_first_token"] + 100.2,
                            t_end=r["t_end"] + 100.0) for r in records]
    c = judge_one({"key": "k", "metric": "hit_ratio", "statistic": "mean", "comparison": "absolute",
                   "candidate": "fx", "threshold": 0.95}, again)
    assert c["cells"][0]["sessions"] == 8 and c["ci"] == pytest.approx([low, high], rel=1e-5)


def soak(values: list[float], per_window: int = 40) -> list[dict]:
    out = []
    for rep, value in enumerate(values, start=1):
        out += [request("fx", value * (1 + 0.001 * i), t_send=100.0 * rep + i, repetition=rep, phase="soak",
                        concurrency=16, session=f"w{rep}-{i}") for i in range(per_window)]
    return out


DRIFT = {"key": "k", "metric": "ttft", "statistic": "p90", "comparison": "drift", "candidate": "fx", "phase": "soak",
         "op": "<=", "threshold": 0.2}


def test_drift_compares_late_with_early_steady_windows_leaving_out_the_warm_up():
    # window 1 is the cold warm-up (5× slower); steady windows 2–3 early, 4–5 late
    c = judge_one(DRIFT, soak([10.0, 2.0, 2.1, 2.6, 2.7]), gate=4)
    cell = c["cells"][0]
    assert cell["warmup_windows"] == 1 and cell["early_windows"] == [2, 3] and cell["late_windows"] == [4, 5]
    # judge version 6: the quantile the criterion names, from each window's own 40 requests (a p90 needs ≥ 36)
    assert cell["statistic_used"] == "p90" and cell["requests_per_window"] == [40] * 4
    assert cell["per_window"][0] == pytest.approx(float(np.quantile([2.0 * (1 + 0.001 * i) for i in range(40)], 0.9)))
    early, late = cell["per_window"][:2], cell["per_window"][2:]
    assert c["value"] == pytest.approx(math.sqrt(late[0] * late[1]) / math.sqrt(early[0] * early[1]) - 1, rel=1e-4)
    assert c["value"] > 0.2 and c["verdict"] in ("fail", "marginal")


def test_a_cold_first_window_no_longer_passes_as_negative_drift():
    steady = judge_one(DRIFT, soak([10.0, 2.0, 2.02, 2.01, 2.03]), gate=4)
    assert abs(steady["value"]) < 0.02 and steady["verdict"] == "pass"


def test_a_p99_drift_on_windows_too_small_for_it_is_invalid_never_judged_on_another_quantile():
    plan = plan_with([{**DRIFT, "statistic": "p99"}], gate=4, min_requests_per_cell=1)
    records = soak([10.0, 2.0, 2.02, 2.01, 2.03], per_window=40)
    verdict = evaluate(plan, 4, [("records.jsonl", jsonl(records)), summaries_file(records), inventory_file()])
    check = next(c for c in verdict["validity"]["checks"] if c["name"] == "repetitions")
    assert verdict["verdict"] == "invalid" and not check["ok"]
    assert "a p99 needs at least 368 successful requests per steady window" in check["detail"]
    assert "(window 2: 40, window 3: 40, window 4: 40, window 5: 40)" in check["detail"]


def test_read_bandwidth_comes_from_retrieval_records_with_an_order_statistic_interval():
    gbps = [4.0 + 0.05 * i for i in range(64)]
    retrieves = [{"schema": "fxpilot.retrieve/1", "run_id": "t", "arm": "fx", "instance": "n", "gpu": i % 8,
                  "tokens": 2048, "bytes": 1, "seconds": 0.1, "gbps": g, "tier": "fx", "simulated": True}
                 for i, g in enumerate(gbps)]
    c = judge_one({"key": "k", "metric": "read_bw", "statistic": "p50", "comparison": "absolute", "candidate": "fx",
                   "threshold": 5.0}, reps_of("fx", [[1.0] * 8]), ("retrieve.jsonl", jsonl(retrieves)), gate=2)
    lo = int(stats.binom.ppf(0.025, 64, 0.5))
    hi = int(stats.binom.ppf(0.975, 64, 0.5)) + 1
    assert c["value"] == pytest.approx(float(np.quantile(gbps, 0.5)))
    assert c["ci"] == pytest.approx([gbps[lo - 1], gbps[hi - 1]]) and c["cells"][0]["gpus"] == 8


def test_output_match_compares_sessions_between_arms():
    records = []
    for arm in ("fx", "recompute"):
        for i in range(4):
            digest = "b" * 64 if (arm == "fx" and i == 3) else "a" * 64
            records.append(request(arm, 0.5, t_send=i, phase="probe", session=f"p{i}", output_sha256=digest))
    spec = {"key": "k", "metric": "output_match", "statistic": "mean", "comparison": "absolute", "candidate": "fx",
            "baseline": "recompute", "phase": "probe", "threshold": 1}
    c = judge_one(spec, records, gate=2)
    assert c["value"] == 0.75 and c["n"] == 4 and c["cells"][0]["mismatched_sessions"] == ["p3"]
    exact = judge_one({**spec, "statistic": "min"}, records, gate=2)
    assert exact["value"] == 0.0 and exact["ci"] == [0.0, 0.0] and exact["verdict"] == "fail"


def devices(*models: str) -> list[dict]:
    return [{"index": i, "model": m} for i, m in enumerate(models)]


def test_inventory_metrics_take_the_worst_node():
    plan = plan_with([
        {"key": "gpus", "metric": "gpu_count", "statistic": "min", "comparison": "absolute", "threshold": 8},
        {"key": "rocm", "metric": "rocm_version", "statistic": "min", "comparison": "absolute", "threshold": 7.2},
        {"key": "link", "metric": "link_speed_gbps", "statistic": "min", "comparison": "absolute", "threshold": 100},
        {"key": "model", "metric": "gpu_model_match", "statistic": "min", "comparison": "absolute", "threshold": 1},
    ], gate=1)
    slow_nic = [{"name": "a", "state": "up", "speed_gbps": 100, "rdma_device": "mlx5_0", "rdma_state": "ACTIVE"},
                {"name": "b", "state": "up", "speed_gbps": 25, "rdma_device": "mlx5_1", "rdma_state": "ACTIVE"},
                {"name": "c", "state": "down", "speed_gbps": 10, "rdma_device": "mlx5_2", "rdma_state": "DOWN"}]
    files = [inventory_file("node1"),
             inventory_file("node2", gpus={"count": 4, "model": "MI300X", "devices": devices(*["MI300X"] * 4)},
                            rocm="7.1.0", nics=slow_nic)]
    verdict = evaluate(plan, 1, files)
    values = {c["key"]: (c["value"], c["verdict"]) for c in verdict["criteria"]}
    assert values == {"gpus": (4.0, "fail"), "rocm": (7.1, "fail"), "link": (25.0, "fail"), "model": (0.0, "fail")}
    gpus = verdict["criteria"][0]
    assert [(c["node"], c["value"]) for c in gpus["cells"]] == [("node1", 8.0), ("node2", 4.0)]
    assert "node2 4 GPUs" in gpus["explanation"] and verdict["verdict"] == "fail"
    assert verdict["inventory"][0]["node"] == "node1" and "_source" not in verdict["inventory"][0]


@pytest.mark.parametrize(("op", "threshold", "interval", "expected"), [
    (">=", 1.0, (1.0, 2.0), "pass"), (">=", 1.0, (0.5, 2.0), "marginal"), (">=", 1.0, (0.2, 0.9), "fail"),
    (">", 1.0, (1.0, 2.0), "marginal"), (">", 1.0, (0.5, 1.0), "fail"),
    ("<=", 0.2, (0.0, 0.2), "pass"), ("<=", 0.2, (0.1, 0.3), "marginal"), ("<=", 0.2, (0.3, 0.4), "fail"),
    ("<", 0.2, (0.1, 0.2), "marginal"), ("==", 1.0, (1.0, 1.0), "pass"), ("==", 1.0, (0.9, 1.1), "marginal"),
    ("==", 1.0, (1.1, 1.2), "fail"),
])
def test_the_rule_passes_only_a_whole_interval_and_fails_only_a_missing_one(op, threshold, interval, expected):
    assert decide(op, threshold, *interval) == expected


def test_every_verdict_explains_itself_in_two_languages():
    c = judge_one({"key": "k", "metric": "ttft", "statistic": "p50", "comparison": "speedup", "candidate": "fx",
                   "baseline": "local_nvme", "threshold": 1.5}, reps_of("fx", FX) + reps_of("local_nvme", LOCAL))
    assert "fx TTFT p50 6 s vs local_nvme 12 s" in c["explanation"] and "speed-up 2.00×" in c["explanation"]
    assert "n = 16 + 16 requests" in c["explanation"] and "bar ≥ 1.50×" in c["explanation"]
    assert "95 % interval" in c["explanation"]
    assert "加速比" in c["explanation_zh"] and "门槛" in c["explanation_zh"] and "置信区间" in c["explanation_zh"]
    assert c["rule"].startswith(c["verdict"]) and json.dumps(c, allow_nan=False)
