"""What an independent review got past the judge: each case is refused, invalid, or judged as it should be."""
from __future__ import annotations

import json

import pytest

from gates.judge import RecordError, evaluate, synthetic
from gates.plan import load_plan
from tests.judge.helpers import inventory_file, jsonl, plan_with, request, summaries_file

PLAN = load_plan("default")


def g3_files(frame=None, *, copies: list[tuple[str, bytes]] = ()) -> list[tuple[str, bytes]]:
    frame = synthetic.table1_frame(seed=5) if frame is None else frame
    return [("records.jsonl", synthetic.jsonl(synthetic.records(frame))),
            ("records.summary.json", synthetic.jsonl(synthetic.phase_summaries(frame))), *copies,
            ("node1/inventory.json", json.dumps(synthetic.inventory()).encode())]


def check(verdict: dict, name: str) -> dict:
    return next(c for c in verdict["validity"]["checks"] if c["name"] == name)


def test_a_records_file_copied_with_a_new_run_id_is_a_duplicate():
    frame = synthetic.table1_frame(seed=5)
    copy = frame[frame["arm"] == "fx"].assign(run_id="another-run")
    verdict = evaluate(PLAN, 3, g3_files(frame, copies=[("copy.jsonl", synthetic.jsonl(synthetic.records(copy)))]))
    duplicates = check(verdict, "no-duplicate-requests")
    assert verdict["verdict"] == "invalid" and not duplicates["ok"]
    assert "copy.jsonl line" in duplicates["detail"] and "records.jsonl line" in duplicates["detail"]


def test_a_copy_relabelled_as_another_repetition_is_a_duplicate():
    frame = synthetic.table1_frame(seed=5)
    copy = frame[(frame["arm"] == "fx") & (frame["repetition"] == 1)].assign(repetition=4, run_id="r4")
    verdict = evaluate(PLAN, 3, g3_files(frame, copies=[("rep4.jsonl", synthetic.jsonl(synthetic.records(copy)))]))
    assert not check(verdict, "no-duplicate-requests")["ok"]


def bench_json(arm: str) -> bytes:
    return json.dumps({"max_concurrency": 8, "arm": arm, "phase": "measure", "repetition": 1,
                       "start_times": [1.0 + i for i in range(8)], "ttfts": [0.5] * 8, "latencies": [1.0] * 8,
                       "input_lens": [100] * 8, "output_lens": [10] * 8, "errors": [""] * 8}).encode()


def test_a_vllm_bench_file_given_twice_under_two_names_is_a_duplicate():
    plan = plan_with([{"key": "k", "metric": "ttft", "statistic": "p50", "comparison": "absolute", "candidate": "fx",
                       "threshold": 0}], min_requests_per_cell=1)
    files = [("run-a.json", bench_json("fx")), ("run-b.json", bench_json("fx")), inventory_file()]
    verdict = evaluate(plan, 3, files)
    assert not check(verdict, "no-duplicate-requests")["ok"] and verdict["verdict"] == "invalid"


def test_ok_without_a_first_token_is_a_failed_request():
    # the slowest half of the cell said ok but never produced a token: they count as failures
    records = [request("fx", float(i + 1), t_send=10.0 * i, session=f"s{i}") for i in range(4)]
    records += [request("fx", None, t_send=100.0 + 10 * i, session=f"slow{i}") for i in range(4)]
    plan = plan_with([{"key": "fail", "metric": "error_rate", "statistic": "count", "comparison": "absolute",
                       "candidate": "fx", "op": "<=", "threshold": 0}], min_requests_per_cell=1)
    verdict = evaluate(plan, 3, [("r.jsonl", jsonl(records)), summaries_file(records), inventory_file()], planned=1)
    criterion = verdict["criteria"][0]
    assert criterion["value"] == 4.0 and criterion["verdict"] == "fail"
    assert verdict["counts"]["ok_without_first_token"] == 4


def test_a_first_token_after_the_request_ended_is_refused_with_its_file_and_line():
    records = [request("fx", 1.0, t_send=10.0 * i, session=f"s{i}") for i in range(8)]
    records[5]["t_first_token"] = records[5]["t_end"] + 500.0
    with pytest.raises(RecordError) as caught:
        evaluate(PLAN, 3, [("late.jsonl", jsonl(records)), inventory_file()])
    assert caught.value.source == "late.jsonl" and caught.value.line == 6 and caught.value.field == "t_first_token"
    assert "out of order" in str(caught.value)


def test_messages_show_plain_numbers():
    records = [request("fx", 1.0, t_send=10.0 * i, session=f"s{i}") for i in range(8)]
    records[2]["t_end"] = 1114.11
    records[2]["t_send"] = 1200.5
    records[2]["t_first_token"] = None
    with pytest.raises(RecordError) as caught:
        evaluate(PLAN, 3, [("r.jsonl", jsonl(records)), inventory_file()])
    assert "1114.11" in str(caught.value) and "np." not in str(caught.value)


def test_a_single_repetition_cannot_give_a_spread_based_interval():
    frame = synthetic.table1_frame(seed=5, repetitions=1)
    verdict = evaluate(PLAN, 3, g3_files(frame))
    repetitions = check(verdict, "repetitions")
    assert verdict["verdict"] == "invalid" and not repetitions["ok"]
    assert "g3-ttft-vs-local" in repetitions["detail"] and "needs at least 2" in repetitions["detail"]


def test_zero_failures_in_96_requests_cannot_show_a_rate_of_a_tenth_of_a_percent():
    records = [request("fx", 1.0, t_send=10.0 * i, session=f"s{i}") for i in range(96)]
    plan = plan_with([{"key": "rate", "metric": "error_rate", "statistic": "value", "comparison": "absolute",
                       "candidate": "fx", "op": "<=", "threshold": 0.001}], min_requests_per_cell=1)
    verdict = evaluate(plan, 3, [("r.jsonl", jsonl(records)), inventory_file()], planned=1)  # one look: the last
    rates = check(verdict, "enough-requests-for-rates")
    assert verdict["verdict"] == "invalid" and not rates["ok"]
    assert "too few requests to show ≤ 0.1 %" in rates["detail"] and "needs ≥ 3,688 error-free requests" in rates["detail"]
    assert verdict["criteria"][0]["ci"][1] == pytest.approx(0.0377, abs=1e-3)  # exact 97.5 % upper bound of 0 / 96
    assert verdict["criteria"][0]["cells"][0]["shows"] == "0 of 96 shows ≤ 3.8 %"


def test_one_error_in_384_fails_a_tenth_of_a_percent_bar_once_there_are_enough_requests():
    records = [request("fx", 1.0, t_send=10.0 * i, session=f"s{i}") for i in range(4000)]
    records[7] = request("fx", None, t_send=70.0, session="s7", status="error")
    records += [request("fx", None, t_send=50_000.0 + i, session=f"e{i}", status="error") for i in range(30)]
    plan = plan_with([{"key": "rate", "metric": "error_rate", "statistic": "value", "comparison": "absolute",
                       "candidate": "fx", "op": "<=", "threshold": 0.001}], min_requests_per_cell=1)
    verdict = evaluate(plan, 3, [("r.jsonl", jsonl(records)), summaries_file(records), inventory_file()], planned=1)
    assert verdict["criteria"][0]["verdict"] == "fail"  # 31 in 4,030: the exact lower bound is above 0.1 %


def test_the_cv_criterion_can_fail():
    records = []
    for rep, centre in enumerate((100.0, 160.0, 220.0), start=1):  # three repetitions, CV 0.375
        records += [request("recompute", centre, t_send=1000.0 * rep + i, repetition=rep, session=f"s{rep}-{i}",
                            concurrency=16) for i in range(8)]
    plan = plan_with([{"key": "cv", "metric": "ttft", "statistic": "cv", "comparison": "absolute",
                       "candidate": "recompute", "concurrency": [16], "op": "<=", "threshold": 0.10}],
                     gate=1, min_requests_per_cell=1)
    verdict = evaluate(plan, 1, [("r.jsonl", jsonl(records)), inventory_file()], planned=3)
    criterion = verdict["criteria"][0]
    assert criterion["ci"][0] > 0.10 and criterion["verdict"] == "fail"


def test_the_method_text_says_repetitions_are_the_units():
    verdict = evaluate(PLAN, 3, synthetic.gate_inputs(3))
    assert "over per-repetition statistics" in verdict["bootstrap"]["method"]
    assert "requests resampled" not in verdict["bootstrap"]["method"]


# ---- G1 ----

G1 = plan_with([
    {"key": "model", "metric": "gpu_model_match", "statistic": "min", "comparison": "absolute", "threshold": 1},
    {"key": "link", "metric": "link_speed_gbps", "statistic": "min", "comparison": "absolute", "threshold": 100},
    {"key": "rocm", "metric": "rocm_version", "statistic": "min", "comparison": "absolute", "threshold": 7.2},
], gate=1)


def g1(**changes) -> dict:
    return evaluate(G1, 1, [inventory_file("node1", **changes)])


def criterion(verdict: dict, key: str) -> dict:
    return next(c for c in verdict["criteria"] if c["key"] == key)


def test_every_gpu_must_be_the_planned_model():
    mixed = [{"index": i, "model": "MI308X"} for i in range(7)] + [{"index": 7, "model": "MI300X"}]
    verdict = g1(gpus={"count": 8, "model": "MI308X", "devices": mixed})
    assert criterion(verdict, "model")["verdict"] == "fail" and criterion(verdict, "model")["value"] == 0.875


def test_link_up_needs_the_rdma_port_active():
    nics = [{"name": "ens1f0np0", "state": "up", "speed_gbps": 100, "rdma_device": "mlx5_0", "rdma_state": "DOWN"}]
    assert criterion(g1(nics=nics), "link")["verdict"] == "fail"
    nics[0]["rdma_state"] = "ACTIVE"
    assert criterion(g1(nics=nics), "link")["verdict"] == "pass"


def test_nics_keyed_by_name_are_read_too():
    nics = {"ens1f0np0": {"state": "up", "speed_gbps": 200, "rdma_device": "mlx5_0", "rdma_state": "ACTIVE"}}
    assert criterion(g1(nics=nics), "link")["value"] == 200.0


def test_versions_compare_as_version_tuples():
    assert criterion(g1(rocm="7.10.0"), "rocm")["verdict"] == "pass"
    assert criterion(g1(rocm="7.1.9"), "rocm")["verdict"] == "fail"
    assert criterion(g1(rocm="7.2"), "rocm")["verdict"] == "pass"


def test_a_missing_per_gpu_list_is_invalid_naming_node_and_field():
    verdict = g1(gpus={"count": 8, "model": "MI308X"})
    inventory = check(verdict, "inventory-complete")
    assert verdict["verdict"] == "invalid" and "node node1: field 'gpus.devices'" in inventory["detail"]


def test_an_unknown_rdma_state_is_invalid_naming_node_and_field():
    nics = [{"name": "ens1f0np0", "state": "up", "speed_gbps": 100, "rdma_device": "mlx5_0", "rdma_state": None}]
    inventory = check(g1(nics=nics), "inventory-complete")
    assert not inventory["ok"] and "'nics.ens1f0np0.rdma_state'" in inventory["detail"]
