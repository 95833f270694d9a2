"""Input the judge cannot use is refused with the file, the line and the field — and no verdict."""
from __future__ import annotations

import json

import pytest

from gates.judge import RecordError, evaluate, lmcache_log, synthetic
from gates.judge.records import load_inputs
from gates.plan import load_plan
from tests.judge.helpers import inventory_file, jsonl, request

PLAN = load_plan("default")


def good_records() -> list[dict]:
    return synthetic.records(synthetic.gate_frames(3))


def refuse(files, gate: int = 3) -> RecordError:
    with pytest.raises(RecordError) as caught:
        evaluate(PLAN, gate, files)
    return caught.value


def test_a_truncated_last_line_is_named():
    data = jsonl(good_records()[:5])[:-40]
    error = refuse([("r.jsonl", data)])
    assert (error.source, error.line) == ("r.jsonl", 5) and "truncated" in str(error)


def test_a_line_that_is_not_json_is_named():
    data = jsonl(good_records()[:3]) + b"hello\n" + jsonl(good_records()[3:6])
    error = refuse([("r.jsonl", data)])
    assert (error.source, error.line) == ("r.jsonl", 4) and "not JSON" in str(error)


def test_a_wrong_type_is_named_with_its_field():
    records = good_records()[:10]
    records[6]["concurrency"] = "16"
    error = refuse([("r.jsonl", jsonl(records))])
    assert (error.line, error.field) == (7, "concurrency") and "'16' is not a whole number" in str(error)


def test_a_bool_is_not_a_number():
    records = good_records()[:10]
    records[2]["output_tokens"] = True
    assert refuse([("r.jsonl", jsonl(records))]).field == "output_tokens"


def test_a_missing_field_is_named():
    records = good_records()[:10]
    del records[3]["t_end"]
    error = refuse([("r.jsonl", jsonl(records))])
    assert (error.line, error.field, error.message) == (4, "t_end", "missing")


def test_an_unknown_schema_is_refused():
    records = [dict(r, schema="fxpilot.request/2") for r in good_records()[:3]]
    error = refuse([("r.jsonl", jsonl(records))])
    assert (error.line, error.field) == (1, "schema") and "unknown schema" in str(error)


def test_a_changed_schema_mid_file_is_refused():
    records = good_records()[:3]
    records[1]["schema"] = "fxpilot.retrieve/1"
    assert (refuse([("r.jsonl", jsonl(records))]).line, refuse([("r.jsonl", jsonl(records))]).field) == (2, "schema")


def test_impossible_values_are_refused():
    records = good_records()[:10]
    records[4]["t_end"] = records[4]["t_send"] - 1
    error = refuse([("r.jsonl", jsonl(records))])
    assert (error.line, error.field) == (5, "t_end") and "earlier than t_send" in str(error)
    records = good_records()[:10]
    records[8]["status"] = "fine"
    assert refuse([("r.jsonl", jsonl(records))]).field == "status"


def test_zero_successful_requests_is_an_error():
    records = [dict(r, status="error", error="x", t_first_token=None) for r in good_records()]
    error = refuse([("r.jsonl", jsonl(records)), inventory_file()])
    assert "zero successful requests" in str(error) and error.field == "status"


def test_an_arm_the_plan_needs_but_the_files_lack_is_an_error():
    records = [r for r in good_records() if r["arm"] != "local_nvme"]
    error = refuse([("r.jsonl", jsonl(records)), inventory_file()])
    assert error.field == "arm" and "'local_nvme'" in str(error) and "r.jsonl" in str(error)


def test_g1_without_an_inventory_is_an_error():
    error = refuse([("r.jsonl", jsonl(synthetic.records(synthetic.gate_frames(1))))], gate=1)
    assert "fxpilot.inventory/1" in str(error)


def test_g2_without_retrievals_is_an_error():
    error = refuse([("r.jsonl", jsonl(synthetic.records(synthetic.gate_frames(2)))), inventory_file()], gate=2)
    assert "fxpilot.retrieve/1" in str(error)


def test_a_file_that_cannot_be_read_is_named(tmp_path):
    error = refuse([tmp_path / "missing.jsonl"])
    assert "missing.jsonl" in str(error) and "cannot be read" in str(error)


def test_an_empty_file_is_refused():
    assert "empty" in str(refuse([("r.jsonl", b"\n\n")]))


def test_vllm_bench_json_without_detailed_arrays_says_how_to_fix_it():
    result = {"date": "20260629-120000", "backend": "vllm", "max_concurrency": 8, "completed": 16, "failed": 0,
              "median_ttft_ms": 7530.0, "arm": "fx"}
    error = refuse([("bench.json", json.dumps(result).encode())])
    assert "--save-detailed" in str(error) and error.field == "start_times"


def test_vllm_bench_detailed_json_becomes_request_records():
    result = {"max_concurrency": 2, "num_prompts": 3, "arm": "fx", "phase": "measure", "repetition": "2",
              "start_times": [10.0, 10.5, 11.0], "ttfts": [0.5, 0.7, 0.0], "latencies": [2.0, 2.5, 0.1],
              "input_lens": [100, 100, 100], "output_lens": [16, 16, 0], "errors": ["", "", "Bad Gateway"],
              "generated_texts": ["a", "b", ""]}
    inputs = load_inputs([("bench.json", json.dumps(result).encode())])
    rows = inputs.requests.sort_values("t_send")
    assert list(rows["status"]) == ["ok", "ok", "error"]
    assert list(rows["t_first_token"].round(6)[:2]) == [10.5, 11.2] and list(rows["t_end"]) == [12.0, 13.0, 11.1]
    assert set(rows["repetition"]) == {2} and set(rows["concurrency"]) == {2} and inputs.kinds == {"bench.json": "requests"}
    assert rows["output_sha256"].iloc[0] == "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"


def test_vllm_bench_json_needs_the_arm():
    result = {"max_concurrency": 2, "start_times": [1.0], "ttfts": [0.1], "input_lens": [1], "output_lens": [1],
              "errors": [""]}
    assert refuse([("bench.json", json.dumps(result).encode())]).field == "arm"


def test_lmcache_retrieved_lines_become_retrieve_records():
    log = ("INFO 06-29 12:00:01 [rank 3] LMCache INFO: Retrieved 2048 out of 2048 required tokens (from 2048 total "
           "tokens). size: 0.2344 gb, cost 45.1200 ms, throughput: 5.1900 GB/s\n"
           "(VllmWorker rank=5 pid=1) LMCache INFO: Retrieved 1024 out of 2048 required tokens (from 4096 total "
           "tokens). size: 0.1172 gb, cost 30.0 ms, throughput: 3.9 GB/s\n"
           "LMCache INFO: Storing KV cache for 2048 out of 12288 tokens\n")
    records = lmcache_log.parse_log(log, run_id="r1", arm="fx", instance="node1:8000", simulated=True)
    assert [(r["gpu"], r["tokens"], r["gbps"], r["seconds"]) for r in records] == [(3, 2048, 5.19, 0.04512),
                                                                                   (5, 1024, 3.9, 0.03)]
    assert records[0]["bytes"] == round(0.2344 * 1024 ** 3) and records[0]["schema"] == "fxpilot.retrieve/1"
    inputs = load_inputs([("retrieve.jsonl", lmcache_log.to_jsonl(records))])
    assert list(inputs.retrieves["gbps"]) == [3.9, 5.19]


def test_a_raw_lmcache_log_is_refused_with_directions():
    log = b"LMCache INFO: Retrieved 2048 out of 2048 required tokens (from 2048 total tokens). size: 0.2344 gb, cost 45.12 ms, throughput: 5.19 GB/s\n"
    assert "parse_log" in str(refuse([("lmcache.log", log)]))


def test_a_bad_phase_summary_names_the_counter():
    summary = {"schema": "fxpilot.phase/1", "arm": "fx", "phase": "measure", "concurrency": 8, "repetition": 1,
               "simulated": True, "metrics_before": {"vllm:prompt_tokens_total": "lots"}}
    error = refuse([("r.jsonl", jsonl(good_records())), ("s.json", jsonl([summary]))])
    assert (error.source, error.line, error.field) == ("s.json", 1, "metrics_before.vllm:prompt_tokens_total")


def test_no_verdict_is_written_on_bad_input(tmp_path):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    bad = tmp_path / "r.jsonl"
    bad.write_bytes(jsonl([request("fx", 1.0)]) + b'{"schema": ')
    out = tmp_path / "out.json"
    with pytest.raises(CommandError, match="line 2"), open(out, "w") as handle:
        call_command("judge", "--gate", "G3", str(bad), stdout=handle)
    assert out.read_text() == ""


def test_a_json_object_of_an_unknown_kind_is_refused_by_its_schema():
    error = refuse([("thing.json", json.dumps({"hello": "world"}, indent=2).encode())])
    assert error.field == "schema" and "unknown schema None" in str(error)


def test_a_pretty_printed_phase_summary_is_read():
    summary = {"schema": "fxpilot.phase/1", "arm": "fx", "phase": "measure", "concurrency": 8, "repetition": 1,
               "simulated": True, "max_in_flight": 8}
    inputs = load_inputs([("s.json", json.dumps(summary, indent=2).encode())])
    assert inputs.summaries[0]["max_in_flight"] == 8 and inputs.kinds == {"s.json": "phase-summary"}
