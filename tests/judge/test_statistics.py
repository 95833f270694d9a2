"""Hand-computed cases for each statistic and comparison."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gates.judge import bootstrap, evaluate
from gates.judge.verdicts import decide
from tests.judge.helpers import inventory_file, jsonl, plan_with, request


def judge_one(criterion: dict, records: list[dict], *extra_files, gate: int = 3, **judging) -> dict:
    plan = plan_with([criterion], gate=gate, **{"min_requests_per_cell": 1, **judging})
    files = [("records.jsonl", jsonl(records)), inventory_file(), *extra_files]
    verdict = evaluate(plan, gate, files)
    assert verdict["validity"]["valid"], verdict["validity"]
    return verdict["criteria"][0]


def ttft_arm(arm: str, ttfts: list[float], **kw) -> list[dict]:
    return [request(arm, t, t_send=10.0 * i, session=f"s{i}", **kw) for i, t in enumerate(ttfts)]


FX = [1, 2, 3, 4, 5, 6, 7, 8]
LOCAL = [2, 4, 6, 8, 10, 12, 14, 16]


def test_speedup_is_baseline_over_candidate():
    c = judge_one({"key": "k", "metric": "ttft", "statistic": "p50", "comparison": "speedup", "candidate": "fx",
                   "baseline": "local_nvme", "threshold": 1.5}, ttft_arm("fx", FX) + ttft_arm("local_nvme", LOCAL))
    assert (c["value"], c["cells"][0]["candidate_value"], c["cells"][0]["baseline_value"]) == (2.0, 4.5, 9.0)
    assert c["n"] == 16 and c["cells"][0]["concurrency"] == 1


def test_reduction_is_one_minus_candidate_over_baseline():
    c = judge_one({"key": "k", "metric": "ttft", "statistic": "p50", "comparison": "reduction", "candidate": "fx",
                   "baseline": "local_nvme", "threshold": 0.2}, ttft_arm("fx", FX) + ttft_arm("local_nvme", LOCAL))
    assert c["value"] == 0.5


@pytest.mark.parametrize(("statistic", "expected"), [("p50", 4.5), ("p90", 7.3), ("p99", 7.93), ("mean", 4.5),
                                                     ("min", 1.0), ("max", 8.0)])
def test_absolute_statistics_use_linear_quantiles(statistic, expected):
    c = judge_one({"key": "k", "metric": "ttft", "statistic": statistic, "comparison": "absolute", "candidate": "fx",
                   "threshold": 0}, ttft_arm("fx", FX))
    assert c["value"] == pytest.approx(expected)


def test_gain_compares_throughput_of_each_cell():
    fx = [request("fx", 1.0, t_send=5.0 * i, t_end=5.0 * i + 5.0, output_tokens=10, session=f"s{i}") for i in range(8)]
    local = [request("local_nvme", 1.0, t_send=10.0 * i, t_end=10.0 * i + 10.0, output_tokens=10, session=f"s{i}")
             for i in range(8)]
    c = judge_one({"key": "k", "metric": "throughput", "statistic": "mean", "comparison": "gain", "candidate": "fx",
                   "baseline": "local_nvme", "threshold": 0.2}, fx + local)
    # fx: 80 tokens in 40 s = 2 tok/s; local: 80 tokens in 80 s = 1 tok/s; one repetition each: no spread
    assert c["cells"][0]["candidate_value"] == 2.0 and c["cells"][0]["baseline_value"] == 1.0
    assert c["value"] == 1.0 and c["ci"] == [1.0, 1.0] and c["verdict"] == "pass"


def test_cv_is_the_spread_of_per_repetition_medians():
    records = []
    for rep, centre in ((1, 10.0), (2, 12.0), (3, 14.0)):
        records += [request("recompute", centre + d, t_send=100.0 * rep + i, repetition=rep, session=f"s{i}")
                    for i, d in enumerate((-1.0, 0.0, 1.0))]
    c = judge_one({"key": "k", "metric": "ttft", "statistic": "cv", "comparison": "absolute", "candidate": "recompute",
                   "op": "<=", "threshold": 0.5}, records)
    assert c["value"] == pytest.approx(2.0 / 12.0, rel=1e-5)  # sample std of (10, 12, 14) = 2, mean 12


def test_error_rate_value_is_the_failed_fraction():
    records = ttft_arm("fx", [1.0] * 8) + [request("fx", None, t_send=200.0 + i, session=f"e{i}", status="error")
                                           for i in range(2)]
    c = judge_one({"key": "k", "metric": "error_rate", "statistic": "value", "comparison": "absolute",
                   "candidate": "fx", "op": "<=", "threshold": 0.001}, records)
    # 2 failures in 10: a resample without failures is likely (0.8^10 ≈ 11 %), so the interval reaches 0
    assert c["value"] == 0.2 and c["ci"][0] == 0.0 and c["verdict"] == "marginal" and c["n"] == 10


def test_hit_ratio_is_cached_over_prompt_tokens():
    records = [request("fx", 1.0, t_send=i, session=f"s{i}", prompt_tokens=100, cached_tokens=50 if i % 2 else 100)
               for i in range(8)]
    c = judge_one({"key": "k", "metric": "hit_ratio", "statistic": "mean", "comparison": "absolute",
                   "candidate": "fx", "threshold": 0.95}, records)
    assert c["value"] == 0.75 and c["verdict"] == "fail"  # at most 7 of 8 full hits in 97.5 % of resamples


def test_drift_is_last_window_over_first_minus_one():
    records = []
    for rep, value in ((1, 2.0), (2, 2.2), (3, 2.5)):
        records += [request("fx", value, t_send=100.0 * rep + i, repetition=rep, phase="soak", concurrency=16,
                            session=f"s{i}") for i in range(8)]
    spec = {"key": "k", "metric": "ttft", "statistic": "p99", "comparison": "drift", "candidate": "fx", "phase": "soak",
            "op": "<=", "threshold": 0.2}
    c = judge_one(spec, records, gate=4)
    assert c["value"] == 0.25 and c["ci"] == [0.25, 0.25] and c["verdict"] == "fail"
    assert c["cells"][0]["first_value"] == 2.0 and c["cells"][0]["last_value"] == 2.5
    assert judge_one({**spec, "threshold": 0.3}, records, gate=4)["verdict"] == "pass"


def test_read_bandwidth_comes_from_retrieval_records():
    retrieves = [{"schema": "fxpilot.retrieve/1", "run_id": "t", "arm": "fx", "instance": "n", "gpu": i, "tokens": 2048,
                  "bytes": 1, "seconds": 0.1, "gbps": g, "simulated": True} for i, g in enumerate((4.0, 5.0, 6.0, 7.0))]
    c = judge_one({"key": "k", "metric": "read_bw", "statistic": "p50", "comparison": "absolute", "candidate": "fx",
                   "threshold": 5.0}, ttft_arm("fx", FX), ("retrieve.jsonl", jsonl(retrieves)), gate=2)
    assert c["value"] == 5.5 and c["cells"][0]["gpus"] == 4


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
    assert judge_one({**spec, "statistic": "min"}, records, gate=2)["value"] == 0.0


def test_inventory_metrics_take_the_worst_node():
    plan = plan_with([
        {"key": "gpus", "metric": "gpu_count", "statistic": "min", "comparison": "absolute", "threshold": 8},
        {"key": "rocm", "metric": "rocm_version", "statistic": "min", "comparison": "absolute", "threshold": 7.2},
        {"key": "link", "metric": "link_speed_gbps", "statistic": "min", "comparison": "absolute", "threshold": 100},
        {"key": "model", "metric": "gpu_model_match", "statistic": "min", "comparison": "absolute", "threshold": 1},
    ], gate=1)
    slow_nic = [{"name": "a", "state": "up", "speed_gbps": 100, "rdma_device": "mlx5_0"},
                {"name": "b", "state": "up", "speed_gbps": 25, "rdma_device": "mlx5_1"},
                {"name": "c", "state": "down", "speed_gbps": 10, "rdma_device": "mlx5_2"}]
    files = [inventory_file("node1"),
             inventory_file("node2", gpus={"count": 4, "model": "AMD Instinct MI300X"}, rocm="7.1.0", nics=slow_nic)]
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


def test_bootstrap_window_method_agrees_with_direct_resampling():
    x = np.sort(np.random.default_rng(1).lognormal(0, 0.5, 20_000))
    windowed = bootstrap._quantile(x, 0.5, 2000, np.random.default_rng(2))
    direct = bootstrap._quantile_direct(x, 9999, 0.5, 2, 2000, np.random.default_rng(3))
    assert np.quantile(windowed, [0.025, 0.5, 0.975]) == pytest.approx(np.quantile(direct, [0.025, 0.5, 0.975]), rel=3e-3)


def test_bootstrap_of_binary_means_is_binomial_and_seeded():
    values = np.array([0.0] * 90 + [1.0] * 10)
    a = bootstrap.resample(values, "mean", 500, bootstrap.rng_for(7, "k", 8, "candidate"))
    b = bootstrap.resample(values, "mean", 500, bootstrap.rng_for(7, "k", 8, "candidate"))
    assert np.array_equal(a, b) and 0.05 < a.mean() < 0.15


def test_every_verdict_explains_itself_in_two_languages():
    c = judge_one({"key": "k", "metric": "ttft", "statistic": "p50", "comparison": "speedup", "candidate": "fx",
                   "baseline": "local_nvme", "threshold": 1.5}, ttft_arm("fx", FX) + ttft_arm("local_nvme", LOCAL))
    assert "fx TTFT p50 4.5 s vs local_nvme 9 s" in c["explanation"] and "speed-up 2.00×" in c["explanation"]
    assert "n = 8 + 8 requests" in c["explanation"] and "bar ≥ 1.50×" in c["explanation"]
    assert "加速比" in c["explanation_zh"] and "门槛" in c["explanation_zh"] and "置信区间" in c["explanation_zh"]
    assert c["rule"].startswith(c["verdict"]) and json.dumps(c, allow_nan=False)
