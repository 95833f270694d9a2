"""Which tier served a prompt token, measured (issue 43, items 2 and 6; issue 44, items 3 and 5; issue 45): the
device bytes of a cold window against its external hits, LMCache's DRAM emptied before it, the HBM/DRAM/disk shares,
read bandwidth per window, the hash and the LMCache build as observed, G4's increment over DRAM, the open-loop
schedule, the concurrency measured in flight. Summaries are made here in the workload client's format."""
from __future__ import annotations

import json

import pytest

from gates.judge import evaluate, synthetic
from gates.judge.records import RecordError
from gates.plan import load_plan

PLAN = load_plan("default")
PER_TOKEN = synthetic.KV_BYTES_PER_TOKEN


def changed(gate: int, change, *, simulated: bool = True) -> list[tuple[str, bytes]]:
    """The synthetic gate's inputs with every phase summary passed through change(summary)."""
    out = []
    for name, data in synthetic.gate_inputs(gate, simulated=simulated):
        if name.endswith(".summary.json"):
            rows = [json.loads(line) for line in data.decode().splitlines()]
            for row in rows:
                change(row)
            data = synthetic.jsonl(rows)
        out.append((name, data))
    return out


def check(verdict: dict, name: str) -> dict:
    return next(c for c in verdict["validity"]["checks"] if c["name"] == name)


def external(summary: dict) -> float:
    return summary["metrics_after"]["vllm:external_prefix_cache_hits_total"] - \
        summary["metrics_before"]["vllm:external_prefix_cache_hits_total"]


# ---- tier-bytes-match ----

def test_device_bytes_equal_to_the_external_hits_pass_and_say_the_ratio():
    verdict = evaluate(PLAN, 2, synthetic.gate_inputs(2))
    found = check(verdict, "tier-bytes-match")
    assert verdict["verdict"] == "pass" and found["ok"], found
    assert "device nvme1n1 read 1× the bytes of its external hits" in found["detail"]


@pytest.mark.parametrize("factor, ok", [(0.79, False), (0.8, True), (1.0, True), (1.25, True), (1.26, False)])
def test_the_tolerance_is_0_8_to_1_25_of_the_expected_bytes(factor, ok):
    def scale(summary):
        if summary["arm"] == "fx" and summary["phase"] == "measure" and summary["repetition"] == 3:
            summary["tier_bytes"]["device_read_bytes"] = int(external(summary) * PER_TOKEN * factor)
    found = check(evaluate(PLAN, 2, changed(2, scale)), "tier-bytes-match")
    assert found["ok"] is ok, found


def test_a_page_cache_serving_hits_is_invalid_with_both_byte_counts():
    def half(summary):
        if summary["arm"] == "fx" and summary["phase"] == "measure" and summary["repetition"] == 2:
            summary["tier_bytes"]["device_read_bytes"] = int(external(summary) * PER_TOKEN / 2)
    verdict = evaluate(PLAN, 2, changed(2, half))
    found = check(verdict, "tier-bytes-match")
    assert verdict["verdict"] == "invalid" and not found["ok"]
    part = found["detail_said"][0]["values"]
    hits = 16 * (65536 - 512)   # sixteen returning sessions of the synthetic G2, each 512 new tokens
    assert part["hits"] == f"{hits:,}" and part["per_token"] == f"{PER_TOKEN:,}"
    assert part["expected"] == f"{hits * PER_TOKEN:,}" and part["read"] == f"{hits * PER_TOKEN // 2:,}"
    assert part["ratio"] == "0.5" and "a page cache, LMCache's DRAM or another reader" in found["detail"]
    assert all(c["verdict"] == "invalid" for c in verdict["criteria"])     # never a tier fail


def test_another_reader_on_the_device_is_invalid_too():
    def double(summary):
        if summary["arm"] == "fx" and summary["phase"] == "measure":
            summary["tier_bytes"]["device_read_bytes"] *= 2
    found = check(evaluate(PLAN, 2, changed(2, double)), "tier-bytes-match")
    assert not found["ok"] and "another reader used the device" in found["detail"]


@pytest.mark.parametrize("simulated", [True, False])
def test_a_missing_or_unreadable_counter_is_invalid_with_the_reason_real_or_simulated(simulated):
    def unreadable(summary):
        if summary["arm"] == "fx" and summary["phase"] == "measure":
            if summary["repetition"] == 1:
                summary["tier_bytes"] = {"device": "nvme1n1", "device_read_bytes": None,
                                         "error": "/proc/diskstats has no line for nvme1n1"}
            elif summary["repetition"] == 2:
                del summary["tier_bytes"]
    found = check(evaluate(PLAN, 2, changed(2, unreadable, simulated=simulated)), "tier-bytes-match")
    assert not found["ok"]
    assert ("fx/measure@8 rep 1 on records.summary.json: cannot be verified: the device counter could not be read: "
            "/proc/diskstats has no line for nvme1n1") in found["detail"]
    assert "rep 2 on records.summary.json: cannot be verified: no tier_bytes" in found["detail"]


def test_without_kv_bytes_per_token_the_bytes_cannot_be_compared_but_the_model_and_dtype_give_them():
    def no_width(summary):
        summary.get("versions", {}).pop("kv_bytes_per_token", None)
    found = check(evaluate(PLAN, 2, changed(2, no_width)), "tier-bytes-match")
    assert not found["ok"] and "no KV bytes per token recorded" in found["detail"]

    def model_and_dtype(summary):
        versions = summary.get("versions", {})
        if versions.pop("kv_bytes_per_token", None):
            versions.update(model="Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", kv_cache_dtype="fp8")
    assert check(evaluate(PLAN, 2, changed(2, model_and_dtype)), "tier-bytes-match")["ok"]


# ---- dram-cleared ----

@pytest.mark.parametrize("value, words", [(False, "was not emptied before the window (dram_cleared: false): the "
                                                  "window did not start cold"),
                                          (None, "cannot be verified: the phase summary does not say LMCache's DRAM "
                                                 "was emptied")])
def test_a_cold_window_that_did_not_start_with_dram_emptied_is_invalid(value, words):
    def not_cleared(summary):
        if summary["phase"] == "measure" and summary["repetition"] == 5:
            summary["dram_cleared"] = value
    verdict = evaluate(PLAN, 3, changed(3, not_cleared))
    found = check(verdict, "dram-cleared")
    assert verdict["verdict"] == "invalid" and not found["ok"] and words in found["detail"], found
    assert "fx/measure@8 rep 5" in found["detail"] and "local_nvme/measure@8 rep 5" in found["detail"]


def test_recompute_has_no_dram_to_clear():
    found = check(evaluate(PLAN, 1, synthetic.gate_inputs(1)), "dram-cleared")
    assert found["ok"] and found["detail"] == "no cold window of an LMCache arm"


# ---- tier shares, read bandwidth per window ----

def test_tier_shares_split_hbm_dram_and_disk_per_arm_and_stratum():
    def some_from_hbm_and_dram(summary):
        if summary["arm"] == "fx" and summary["phase"] == "replay":
            # of the external hits, a quarter read from the device: the rest came from DRAM; and 1,000 HBM hits
            summary["metrics_after"]["vllm:prefix_cache_hits_total"] = 1000.0
            summary["metrics_after"]["vllm:external_prefix_cache_hits_total"] -= 1000.0
            summary["tier_bytes"]["device_read_bytes"] = int(external(summary) / 4 * PER_TOKEN)
    verdict = evaluate(PLAN, 4, changed(4, some_from_hbm_and_dram))
    rows = {(r["arm"], r["phase"]): r for r in verdict["tier_shares"]["arms"]}
    fx = rows["fx", "replay"]
    prompt = 3 * 32 * 24000
    cached = 3 * 32 * (24000 - 512)
    assert fx["prompt_tokens"] == prompt and fx["windows"] == 3
    assert fx["hbm"] == pytest.approx(3000 / prompt, rel=1e-5)
    assert fx["disk"] == pytest.approx((cached - 3000) / 4 / prompt, rel=1e-4)
    assert fx["dram"] == pytest.approx((cached - 3000) * 3 / 4 / prompt, rel=1e-4)
    assert fx["hbm"] + fx["dram"] + fx["disk"] + fx["recomputed"] == pytest.approx(1.0, abs=1e-5)
    assert fx["disk_tier"] == "fx" and fx["disk_source"] == "device bytes ÷ KV bytes per token"
    assert set(fx["strata"]) == {"first", "returning"}
    returning = fx["strata"]["returning"]
    assert returning["hbm"] + returning["dram"] + returning["disk"] == pytest.approx(returning["cached"], rel=1e-4)
    dram = rows["dram", "replay"]
    assert dram["disk"] == 0.0 and dram["dram"] == pytest.approx(0.6, rel=1e-3) and dram["disk_source"] == "no disk tier"
    assert rows["recompute", "replay"]["external"] == 0.0


def test_read_bandwidth_per_window_from_device_bytes_else_from_lmcache_lines_saying_which():
    verdict = evaluate(PLAN, 2, synthetic.gate_inputs(2))
    window = next(w for w in verdict["read_bw_windows"] if w["phase"] == "measure" and w["repetition"] == 1)
    assert window["source"] == "device" and window["device"] == "nvme1n1"
    assert window["gbps"] == pytest.approx(window["device_read_bytes"] / window["seconds"] / 1e9, rel=1e-5)

    def drop(summary):
        summary.pop("tier_bytes", None)
    verdict = evaluate(PLAN, 2, changed(2, drop))
    window = next(w for w in verdict["read_bw_windows"] if w["phase"] == "measure")
    assert window["source"] == "lmcache-retrieved" and window["device"] is None
    assert window["why"].startswith("no tier_bytes")


# ---- the hash and the build as observed ----

def g4_real(change) -> list[tuple[str, bytes]]:
    """The default G4 from real nodes: every summary on node1:8002, the share summaries also as instance B's
    (node2:8002), then each summary passed through change(summary)."""
    out = changed(4, lambda s: s.update(instance="node1:8002"), simulated=False)
    name, data = next((n, d) for n, d in out if n.endswith(".summary.json"))
    rows = [json.loads(line) for line in data.decode().splitlines()]
    for share in [r for r in rows if r["phase"] == "share"]:
        twin = json.loads(json.dumps(share))
        twin["instance"] = "node2:8002"
        for process in twin["versions"]["none_hash"]["observed"]:
            process["process"] = process["process"].replace("node1", "node2")
        rows.append(twin)
    for row in rows:
        change(row)
    return [(n, synthetic.jsonl(rows) if n == name else d) for n, d in out]


def test_one_observed_none_hash_equal_to_the_expected_passes():
    found = check(evaluate(PLAN, 4, g4_real(lambda s: None)), "chunk-hash-shared")
    assert found["ok"] and f"every process observed NONE_HASH {synthetic.NONE_HASH}" in found["detail"], found


def test_a_process_with_another_none_hash_is_invalid_with_both_values():
    def one_process_unseeded(summary):
        if summary["phase"] == "share":
            summary["versions"]["none_hash"]["observed"][1]["value"] = "ffff0000"
    verdict = evaluate(PLAN, 4, g4_real(one_process_unseeded))
    found = check(verdict, "chunk-hash-shared")
    assert verdict["verdict"] == "invalid" and not found["ok"]
    assert (f"fx share on node1:8002: its processes logged different NONE_HASH values: {synthetic.NONE_HASH} "
            "(node1:8000 rank 0); ffff0000 (node1:8000 rank 1)") in found["detail"]
    assert f"observed NONE_HASH ffff0000, expected {synthetic.NONE_HASH}" in found["detail"]
    assert verdict["criteria"][0]["verdict"] == "invalid"


def test_no_observed_none_hash_cannot_be_verified():
    def unobserved(summary):
        if summary["phase"] == "share":
            summary["versions"].pop("none_hash")
    found = check(evaluate(PLAN, 4, g4_real(unobserved)), "chunk-hash-shared")
    assert not found["ok"] and "no process's NONE_HASH was observed" in found["detail"]


def test_instances_on_different_lmcache_builds_or_not_the_plans_are_invalid_with_both_values():
    def other_build(summary):
        if summary.get("instance") == "node1:8002" and "lmcache_fingerprint" in summary.get("versions", {}):
            summary["versions"]["lmcache_fingerprint"]["sha256"] = "a" * 64
    verdict = evaluate(PLAN, 4, g4_real(other_build))
    found = check(verdict, "lmcache-fingerprint")
    assert not found["ok"] and found["detail"].startswith("the instances run different LMCache builds: ")
    assert "aaaaaaaaaaaaaaaa (node1:8002)" in found["detail"] and "5555555555555555 (node2:8002)" in found["detail"]
    assert not check(verdict, "chunk-hash-shared")["ok"]

    expect = {"lmcache_fingerprint": "b" * 64}
    found = check(evaluate(PLAN, 4, g4_real(lambda s: None), expect=expect), "lmcache-fingerprint")
    assert not found["ok"] and f"LMCache fingerprint {'5' * 64} on node1:8002, node2:8002, but the plan names " \
        f"{'b' * 64}" in found["detail"]
    ok = check(evaluate(PLAN, 4, g4_real(lambda s: None), expect={"lmcache_fingerprint": "5" * 64}),
               "lmcache-fingerprint")
    assert ok["ok"] and ok["detail"] == f"one LMCache build on every instance: {'5' * 64}"


# ---- G4: FX's increment over DRAM, the recompute figure reported ----

def test_g4_judges_fx_over_dram_and_reports_the_recompute_figure_without_it_deciding():
    gate = PLAN.gate(4)
    assert gate.arms == ("fx", "dram", "recompute")
    assert PLAN.workloads["replay"]["recompute_prefix_caching"] is True
    verdict = evaluate(PLAN, 4, synthetic.gate_inputs(4))
    speedup = next(c for c in verdict["criteria"] if c["key"] == "g4-replay-speedup")
    assert speedup["baseline"] == "dram" and speedup["verdict"] == "pass" and "gating" not in speedup
    assert speedup["value"] == pytest.approx(3.2 / 2.1, rel=0.05)
    reported = next(c for c in verdict["criteria"] if c["key"] == "g4-replay-speedup-recompute")
    assert reported["gating"] is False and reported["baseline"] == "recompute"
    # the recompute figure failing leaves G4 passing, and the gate's words say it is reported, not deciding
    slow = evaluate(PLAN, 4, synthetic.gate_inputs(4, slowdown={"recompute": 0.2}))
    failed = next(c for c in slow["criteria"] if c["key"] == "g4-replay-speedup-recompute")
    assert failed["verdict"] == "fail" and slow["verdict"] == "pass"
    assert "reported beside them, not deciding: g4-replay-speedup-recompute fail" in slow["explanation"]


def test_a_plan_hashes_as_before_when_every_criterion_gates():
    from gates.plan import validate_plan
    document = PLAN.to_dict()
    assert all("gating" not in c for g in document["gates"] if g["number"] != 4 for c in g["criteria"])
    with pytest.raises(Exception, match="gating"):
        broken = json.loads(json.dumps(document))
        broken["gates"][0]["criteria"][0]["gating"] = "no"
        validate_plan(broken)


# ---- open loop: the schedule kept, the concurrency measured in flight ----

def test_a_soak_whose_client_fell_behind_its_schedule_is_invalid_with_the_lateness():
    def behind(summary):
        if summary["phase"] == "soak":
            summary["schedule_kept"] = summary["repetition"] != 7
            summary["lateness_s"] = {"p99": 4.2, "max": 9.5} if summary["repetition"] == 7 else {"p99": 0.01}
    verdict = evaluate(PLAN, 4, changed(4, behind))
    found = check(verdict, "schedule-kept")
    assert verdict["verdict"] == "invalid" and not found["ok"]
    assert found["detail"] == ("fx/soak@16 rep 7: the client did not keep its open-loop schedule (schedule_kept: "
                               "False; lateness_s.max 9.5, lateness_s.p99 4.2): the window is not judged")
    # the workload client's shape: the soak's one verdict on its client in every window, with its figures
    def client_behind(summary):
        if summary["phase"] == "soak":
            summary["schedule_kept"] = False
            summary["schedule"] = {"max_lateness_s": 0.5, "lateness_p99_s": 2.25, "lateness_max_s": 7.0,
                                   "requests": 4080, "cap_hits": 12}
            summary["lateness_s"] = {"p99": 0.1 * summary["repetition"]}
    found = check(evaluate(PLAN, 4, changed(4, client_behind)), "schedule-kept")
    assert not found["ok"] and found["detail"] == (
        "fx/soak@16 windows 1–24: the client did not keep its open-loop schedule (schedule_kept: False; "
        "schedule.cap_hits 12, schedule.lateness_max_s 7, schedule.lateness_p99_s 2.25, schedule.max_lateness_s 0.5, "
        "schedule.requests 4080): the window is not judged")
    kept = check(evaluate(PLAN, 4, changed(4, lambda s: s.update(schedule_kept=True) if s["phase"] == "soak"
                                          else None)), "schedule-kept")
    assert kept["ok"] and kept["detail"] == "the client kept its open-loop schedule in 24 phase summaries"


def test_the_replay_is_labelled_by_the_concurrency_measured_in_flight_not_the_cap():
    files = synthetic.gate_inputs(4)
    out = []
    for name, data in files:
        rows = [json.loads(line) for line in data.decode().splitlines()] if name.endswith(".jsonl") or \
            name.endswith(".summary.json") else None
        if rows is not None:
            for row in rows:
                if row.get("phase") == "replay":
                    if name.endswith(".summary.json"):
                        row["concurrency"], row["concurrency_cap"] = 64, 8
                        row["in_flight"] = {"max": 4 + row["repetition"], "mean": 2.5}
                    else:   # the measured most in flight differs per repetition; the cap keys the cell
                        row["concurrency"], row["concurrency_cap"] = 4 + row["repetition"], 8
            data = synthetic.jsonl(rows)
        out.append((name, data))
    verdict = evaluate(PLAN, 4, out)
    assert verdict["verdict"] == "pass", [c for c in verdict["validity"]["checks"] if not c["ok"]]
    speedup = next(c for c in verdict["criteria"] if c["key"] == "g4-replay-speedup")
    cell = speedup["cells"][0]
    assert cell["concurrency"] == 8 and cell["in_flight"] == {"max": 7, "mean": 2.5, "cap": 8,
                                                               "source": "phase summaries' in_flight"}
    assert cell["in_flight_baseline"]["max"] == 7
    assert "With at most 7 requests in flight (mean 2.5; the client's cap 8), phase replay" in speedup["explanation"]
    assert "在途请求最多 7（平均 2.5；客户端上限 8）" in speedup["explanation_zh"]


def test_a_concurrency_cap_that_is_not_a_whole_number_names_line_and_field():
    record = synthetic.records(synthetic.gate_frames(4).head(1))[0]
    record["concurrency_cap"] = "64"
    with pytest.raises(RecordError, match="concurrency_cap") as error:
        evaluate(PLAN, 4, [("r.jsonl", synthetic.jsonl([record]))])
    assert "line 1" in str(error.value)


# ---- the soak's drift: the statistic the criterion names, each window's own sampling error ----

def test_the_drift_is_judged_on_the_named_p90_with_each_windows_sampling_error():
    verdict = evaluate(PLAN, 4, synthetic.gate_inputs(4))
    drift = next(c for c in verdict["criteria"] if c["key"] == "g4-soak-drift")
    cell = drift["cells"][0]
    assert drift["statistic"] == "p90" and cell["statistic_used"] == "p90" and drift["verdict"] == "pass"
    assert cell["requests_per_window"] == [170] * 23 and len(cell["per_window_log_se"]) == 23
    assert all(0 < se < 0.05 for se in cell["per_window_log_se"])


def test_a_window_too_small_for_the_named_quantile_is_invalid_never_judged_on_another():
    frame = synthetic.gate_frames(4)
    soak = frame[(frame["phase"] == "soak") & (frame["repetition"] == 9)]
    frame = frame.drop(soak.index[30:])                     # window 9 keeps 30 requests: fewer than a p90 needs
    files = [("records.jsonl", synthetic.jsonl(synthetic.records(frame))),
             ("records.summary.json", synthetic.jsonl(synthetic.phase_summaries(frame))),
             ("replay-sample.json", json.dumps(synthetic.replay_sample(frame)).encode())]
    verdict = evaluate(PLAN, 4, files)
    found = check(verdict, "repetitions")
    assert verdict["verdict"] == "invalid" and not found["ok"]
    assert ("g4-soak-drift: fx at concurrency 16: a p90 needs at least 36 successful requests per steady window to "
            "be estimated from the window's own requests (window 9: 30)") in found["detail"]


def test_the_drift_interval_is_welchs_over_the_windows_named_quantile():
    import numpy as np

    from gates.judge import intervals
    verdict = evaluate(PLAN, 4, synthetic.gate_inputs(4))
    cell = next(c for c in verdict["criteria"] if c["key"] == "g4-soak-drift")["cells"][0]
    values = np.array(cell["per_window"])
    half = len(values) // 2
    value, low, high = intervals.drift_t(values[:half], values[half:], verdict["criteria"][0]["confidence"])
    assert cell["early_windows"] == list(range(2, 2 + half)) and len(cell["late_windows"]) == len(values) - half
    assert cell["value"] == pytest.approx(float(value), rel=1e-3, abs=1e-5)
    assert cell["ci"] == [pytest.approx(float(low), rel=1e-3, abs=1e-5), pytest.approx(float(high), rel=1e-3)]
    assert intervals.quantile_min_requests(0.9) == 36 and intervals.quantile_min_requests(0.99) == 368
    assert intervals.quantile_log_se(np.sort(np.exp(np.linspace(0, 1, 35))), 0.9) == float("inf")
    assert np.isfinite(intervals.quantile_log_se(np.sort(np.exp(np.linspace(0, 1, 36))), 0.9))
