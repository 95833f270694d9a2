"""Records built from the published Table 1 against the default plan; validity before performance."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from gates.judge import can_extend, canonical_json, evaluate, synthetic
from gates.plan import load_plan

PLAN = load_plan("default")


def files_of(frame, *, summaries: bool = True, inventory: dict | None = None) -> list[tuple[str, bytes]]:
    files = [("records.jsonl", synthetic.jsonl(synthetic.records(frame))),
             ("node1/inventory.json", json.dumps(inventory or synthetic.inventory()).encode())]
    if summaries:
        files.append(("records.summary.json", synthetic.jsonl(synthetic.phase_summaries(frame))))
    if (frame["phase"] == "replay").any():   # G4: the replay step's oracle (the fidelity and capacity checks)
        files.append(("replay-sample.json", json.dumps(synthetic.replay_sample(frame)).encode()))
    return files


@pytest.mark.parametrize("gate", [1, 2, 3, 4])
def test_synthetic_inputs_pass_each_gate_of_the_default_plan(gate):
    verdict = evaluate(PLAN, gate, synthetic.gate_inputs(gate))
    assert verdict["verdict"] == "pass", verdict["explanation"]
    assert verdict["simulated"] is True and verdict["validity"]["valid"]


def test_table1_records_pass_g3_with_the_published_figures():
    verdict = evaluate(PLAN, 3, synthetic.gate_inputs(3))
    by_key = {c["key"]: c for c in verdict["criteria"]}
    assert by_key["g3-speedup-recompute"]["value"] == pytest.approx(149.48 / 11.85, rel=0.03)
    ttft8 = next(c for c in by_key["g3-ttft-vs-local"]["cells"] if c["concurrency"] == 8)
    assert ttft8["value"] == pytest.approx(1 - 7.53 / 10.17, abs=0.02)
    assert [c["concurrency"] for c in by_key["g3-throughput-vs-local"]["cells"]] == [8, 16, 32]
    assert verdict["plan_sha256"] == PLAN.sha256 and set(verdict["inputs"]) == {
        "records.jsonl", "records.summary.json", "node1/inventory.json", "node2/inventory.json"}
    assert len(verdict["distributions"]["fx@8"]) == 21 and "recompute@16" in verdict["distributions"]
    assert {(m["arm"], m["concurrency"], m["repetition"]) for m in verdict["metrics"]} >= {("fx", 8, 1), ("recompute", 16, 3)}


def test_the_same_records_with_fx_thirty_percent_slower_fail_g3():
    verdict = evaluate(PLAN, 3, synthetic.gate_inputs(3, slowdown={"fx": 1.3}))
    by_key = {c["key"]: c["verdict"] for c in verdict["criteria"]}
    assert verdict["verdict"] == "fail"
    assert by_key == {"g3-speedup-recompute": "pass", "g3-ttft-vs-local": "fail", "g3-throughput-vs-local": "fail",
                      "g3-failures": "pass"}


def test_a_small_noisy_sample_is_marginal_and_continues_to_the_next_look_only():
    frame = synthetic.table1_frame(seed=2, noise=0.6, repetitions=8, hashes=False)
    verdict = evaluate(PLAN, 3, files_of(frame))
    assert verdict["verdict"] == "marginal" and verdict["sequential"]["look"] == 1
    marginal = next(c for c in verdict["criteria"] if c["verdict"] == "marginal")
    assert marginal["ci"][0] < marginal["threshold"] <= marginal["ci"][1]
    assert can_extend(verdict, PLAN, 8) and not can_extend(verdict, PLAN, 12)  # the next look is at 12
    last = evaluate(PLAN, 3, files_of(frame), planned=8)  # a run of 8: its only look is the last
    assert last["verdict"] == "marginal" and last["sequential"]["final"] and not can_extend(last, PLAN, 8)
    assert not can_extend(evaluate(PLAN, 3, synthetic.gate_inputs(3)), PLAN, 12)


def test_validity_comes_first_mixed_simulated_and_real_is_invalid():
    frame = synthetic.gate_frames(3)
    frame.loc[frame["arm"] == "local_nvme", "simulated"] = False
    verdict = evaluate(PLAN, 3, files_of(frame, summaries=False))
    assert verdict["verdict"] == "invalid"
    assert all(c["verdict"] == "invalid" for c in verdict["criteria"])
    check = next(c for c in verdict["validity"]["checks"] if c["name"] == "no-simulated-mixed-with-real")
    assert not check["ok"] and "mixed" in check["detail"] and "invalid" in verdict["explanation"]
    assert "无效" in verdict["explanation_zh"]


def test_a_recompute_arm_that_hits_the_cache_is_invalid_even_when_every_bar_clears():
    frame = synthetic.gate_frames(3)
    frame.loc[frame["arm"] == "recompute", "cached_tokens"] = 60000.0
    verdict = evaluate(PLAN, 3, files_of(frame, summaries=False))
    assert verdict["verdict"] == "invalid"
    assert "recompute/measure" in " ".join(c["detail"] for c in verdict["validity"]["checks"] if not c["ok"])


def test_a_warm_gpu_cache_in_the_metrics_deltas_is_invalid():
    frame = synthetic.gate_frames(3)
    files = files_of(frame, summaries=False)
    summaries = synthetic.phase_summaries(frame)
    for s in summaries:
        if s["arm"] == "fx":
            s["metrics_after"]["vllm:prefix_cache_hits_total"] = s["metrics_after"]["vllm:prompt_tokens_total"] / 2
    verdict = evaluate(PLAN, 3, files + [("s.json", synthetic.jsonl(summaries))])
    assert verdict["verdict"] == "invalid" and "did not make it cold" in verdict["explanation"]


def test_a_cache_arm_that_does_not_hit_is_invalid():
    frame = synthetic.gate_frames(3)
    frame.loc[frame["arm"] == "local_nvme", "cached_tokens"] = 0.0
    assert evaluate(PLAN, 3, files_of(frame, summaries=False))["verdict"] == "invalid"


def test_no_cache_evidence_at_all_is_invalid():
    frame = synthetic.gate_frames(3)
    frame["cached_tokens"] = float("nan")
    verdict = evaluate(PLAN, 3, files_of(frame, summaries=False))
    assert verdict["verdict"] == "invalid" and "cannot be verified" in verdict["explanation"]


def test_a_client_that_could_not_keep_the_concurrency_is_invalid():
    frame = synthetic.gate_frames(3)
    summaries = synthetic.phase_summaries(frame)
    summaries[0]["max_in_flight"] = 3
    files = files_of(frame, summaries=False) + [("s.json", synthetic.jsonl(summaries))]
    verdict = evaluate(PLAN, 3, files)
    assert verdict["verdict"] == "invalid" and "the client was the bottleneck" in verdict["explanation"]


def test_too_few_requests_per_cell_is_invalid():
    frame = synthetic.table1_frame(requests_per_cell=4)
    verdict = evaluate(PLAN, 3, files_of(frame))
    check = next(c for c in verdict["validity"]["checks"] if c["name"] == "min-requests-per-cell")
    assert verdict["verdict"] == "invalid" and "4 successful requests < 8" in check["detail"]


def test_a_missing_concurrency_level_is_invalid():
    frame = synthetic.gate_frames(3)
    frame = frame[~((frame["arm"] == "local_nvme") & (frame["concurrency"] == 32))]
    verdict = evaluate(PLAN, 3, files_of(frame))
    assert verdict["verdict"] == "invalid"
    assert "'local_nvme' has no successful request in phase 'measure' at concurrency 32" in verdict["explanation"]


def test_unrecorded_versions_make_a_run_invalid():
    frame = synthetic.gate_frames(3)
    summaries = synthetic.phase_summaries(frame, versions=False)
    inventory = synthetic.inventory(vllm=None)
    files = [("r.jsonl", synthetic.jsonl(synthetic.records(frame))), ("s.json", synthetic.jsonl(summaries)),
             ("i.json", json.dumps(inventory).encode())]
    assert evaluate(PLAN, 3, files)["verdict"] == "invalid"


def test_the_same_inputs_give_byte_identical_json():
    files = synthetic.gate_inputs(3)
    first, second = canonical_json(evaluate(PLAN, 3, files)), canonical_json(evaluate(PLAN, 3, list(reversed(files))))
    assert first == second


def test_sharing_read_back_on_the_writing_instance_is_invalid():
    frame = synthetic.gate_frames(4)
    share = frame[frame["phase"] == "share"]
    written = share.assign(phase="populate", instance="node1:8000", t_send=share["t_send"] - 1000,
                           t_first_token=share["t_first_token"] - 1000, t_end=share["t_end"] - 1000)
    verdict = evaluate(PLAN, 4, files_of(pd.concat([frame, written])))
    assert verdict["verdict"] == "invalid" and "answered by the instance that wrote" in verdict["explanation"]
    frame.loc[frame["phase"] == "share", "instance"] = "node2:8000"
    assert evaluate(PLAN, 4, files_of(pd.concat([frame, written])))["verdict"] == "pass"


def test_the_same_records_given_twice_are_invalid():
    files = synthetic.gate_inputs(3)
    verdict = evaluate(PLAN, 3, files + [("copy-of-records.jsonl", files[0][1])])
    check = next(c for c in verdict["validity"]["checks"] if c["name"] == "no-duplicate-requests")
    assert verdict["verdict"] == "invalid" and "3072 request record(s) repeat another record's content" in check["detail"]


def test_arms_measured_on_different_versions_are_invalid():
    frame = synthetic.gate_frames(3)
    summaries = synthetic.phase_summaries(frame)
    for summary in summaries:
        if summary["arm"] == "local_nvme":
            summary["versions"] = {**summary["versions"], "vllm": "0.19.0"}
    files = files_of(frame, summaries=False) + [("s.json", synthetic.jsonl(summaries))]
    verdict = evaluate(PLAN, 3, files)
    assert verdict["verdict"] == "invalid" and "report different versions" in verdict["explanation"]


def test_retrievals_logged_for_the_recompute_arm_are_invalid():
    files = synthetic.gate_inputs(2)
    extra = synthetic.retrieve_records(arm="recompute", count=4)
    verdict = evaluate(PLAN, 2, files + [("recompute/retrieve.jsonl", synthetic.jsonl(extra))])
    assert verdict["verdict"] == "invalid" and "no KV connector" in verdict["explanation"]


def test_an_open_loop_replay_below_its_cap_is_not_a_client_bottleneck():
    frame = synthetic.gate_frames(4)
    summaries = synthetic.phase_summaries(frame)
    for summary in summaries:
        if summary["phase"] == "replay":
            summary["max_in_flight"] = 3
    files = files_of(frame, summaries=False) + [("s.json", synthetic.jsonl(summaries))]
    assert evaluate(PLAN, 4, files)["verdict"] == "pass"


def test_a_run_started_with_its_own_repetitions_looks_at_the_plans_looks_below_them_and_at_them():
    frame = synthetic.table1_frame(seed=2, requests_per_cell=8, noise=0.25, repetitions=8)
    verdict = evaluate(PLAN, 3, files_of(frame), planned=10)
    assert verdict["sequential"]["looks"] == [8, 10] and verdict["sequential"]["look"] == 1
    assert verdict["verdict"] == "marginal"
    assert can_extend(verdict, PLAN, 8) and not can_extend(verdict, PLAN, 10) and not can_extend(verdict, PLAN, 20)


