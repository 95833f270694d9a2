"""The simulator answers as vLLM 0.20.1 by default (docs/simulator.md, checked against the real server in
tests/real): no prompt_tokens_details on a miss, an empty reset answer, the prompt echoed in the first event,
LMCache lines after vLLM's worker prefix; FXPILOT_SIM_VLLM_VERSION=0.32.0 answers as the newer version."""
from __future__ import annotations

import json

from gates.judge.lmcache_log import parse_log
from tests.sim.conftest import prompt_ids

CONTEXT = 1024


def test_a_miss_has_no_prompt_tokens_details_and_a_hit_has_them(node, servers):
    server = servers(node, "fx")
    prompt = prompt_ids(CONTEXT)
    miss = server.complete(prompt)
    assert "prompt_tokens_details" not in miss["usage"]
    assert miss["events"][0]["choices"][0]["prompt_token_ids"] == prompt
    assert all(e["choices"][0]["prompt_token_ids"] is None for e in miss["events"][1:] if e["choices"])
    server.reset()
    hit = server.complete(prompt)
    assert hit["usage"]["prompt_tokens_details"] == {"cached_tokens": CONTEXT - 1}


def test_without_the_flag_no_usage_carries_details(node, servers):
    server = servers(node, "fx")
    server.argv.remove("--enable-prompt-tokens-details")
    server.stop()
    server.start()
    prompt = prompt_ids(CONTEXT)
    server.complete(prompt)
    server.reset()
    assert "prompt_tokens_details" not in server.complete(prompt)["usage"]


def test_the_0201_reset_answers_an_empty_200(node, servers):
    server = servers(node, "fx")
    status, _, body = server.post("/reset_prefix_cache")
    assert (status, body) == (200, b"")


def test_the_newer_version_sends_zero_and_says_whether_the_reset_worked(node, servers):
    server = servers(node, "fx", env={"FXPILOT_SIM_VLLM_VERSION": "0.32.0"})
    assert server.complete(prompt_ids(CONTEXT))["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    status, _, body = server.post("/reset_prefix_cache")
    assert (status, json.loads(body)) == (200, {"success": True})
    node.set_faults(reset_refused=True)
    status, _, body = server.post("/reset_prefix_cache")
    assert (status, json.loads(body)) == (200, {"success": False})


def test_retrievals_are_logged_by_each_tp_worker_as_lmcache_writes_them(node, servers):
    server = servers(node, "fx")
    prompt = prompt_ids(CONTEXT)
    server.complete(prompt)
    server.reset()
    server.complete(prompt + prompt_ids(64, 5))
    lines = [line for line in server.log_text().splitlines() if "Retrieved" in line]
    assert len(lines) == 8
    assert lines[3].startswith("(Worker_TP3 pid=") and "\x1b[32;20m[" in lines[3] and "LMCache INFO:\x1b[0m" in lines[3]
    assert "[req_id=cmpl-" in lines[3] and "(cache_engine.py:" in lines[3]
    records = parse_log(server.log_text(), run_id="t", arm="fx", simulated=True)
    assert sorted(r["gpu"] for r in records) == list(range(8))
