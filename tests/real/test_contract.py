"""The protocol contract: the same requests to the simulated server and to real vLLM 0.20.1, and the shapes
fxpilot reads must agree — streamed chunk fields, usage and prompt_tokens_details on a miss and on a hit,
the reset answer, the /metrics names and labels the workload client and the judge read."""
from __future__ import annotations

import json
import urllib.request

import pytest

from runners.remote import workload
from tests.real.conftest import PROMPT_TOKENS
from tests.sim.conftest import SimNode, SimServer

pytestmark = [pytest.mark.real_engine, pytest.mark.django_db]

# The counters fxpilot reads (runners/remote/workload.py, gates/judge/counters.py and validity.py).
READ = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total",
        "vllm:external_prefix_cache_hits_total", "vllm:prompt_tokens_cached_total", "vllm:num_preemptions_total",
        "vllm:request_success_total")


def _post(url: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url + path, data=data, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return response.status, response.read()


def _stream(url: str, model: str, prompt: list[int]) -> list[dict]:
    status, raw = _post(url, "/v1/completions", {
        "model": model, "prompt": prompt, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}, "return_token_ids": True})
    assert status == 200
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n")
    return [json.loads(part[6:]) for part in text.split("\n\n") if part.startswith("data: {")]


def _shape(events: list[dict]) -> dict:
    token_events = [e for e in events if e["choices"]]
    usage = events[-1]["usage"]
    return {
        "event_keys": sorted(set(events[0]) - {"simulated"}),
        "first_choice_keys": sorted(token_events[0]["choices"][0]),
        "later_choice_keys": sorted(token_events[-1]["choices"][0]),
        "echoes_prompt": isinstance(token_events[0]["choices"][0].get("prompt_token_ids"), list),
        "later_prompt_ids": token_events[-1]["choices"][0].get("prompt_token_ids"),
        "usage_keys": sorted(usage),
        "details": sorted(usage.get("prompt_tokens_details") or {}),
        "usage_in_token_events": {json.dumps(e["usage"]) for e in token_events},
        "tokens": len(token_events),
    }


def _metric_labels(url: str) -> dict[str, set[str]]:
    with urllib.request.urlopen(url + "/metrics", timeout=60) as response:
        text = response.read().decode()
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        name, _, rest = line.partition("{")
        if name in READ:
            out.setdefault(name, set()).update(pair.split("=", 1)[0] for pair in workload._split_labels(rest.rpartition("}")[0]))
    return out


def _exchange(url: str, model: str, prompt: list[int]) -> dict:
    miss = _shape(_stream(url, model, prompt))
    status, body = _post(url, "/reset_prefix_cache")
    hit = _shape(_stream(url, model, prompt))
    return {"miss": miss, "reset": (status, body), "hit": hit, "metrics": _metric_labels(url)}


def test_the_simulator_answers_in_the_shapes_real_vllm_0201_answers_in(real_servers, tmp_path):
    real = real_servers.local_nvme
    prompt = [20000 + (i * 7919) % 9000 for i in range(PROMPT_TOKENS)]
    with urllib.request.urlopen(real.url + "/v1/models", timeout=60) as response:
        model = json.loads(response.read())["data"][0]["id"]
    from_real = _exchange(real.url, model, prompt)
    sim = SimServer(SimNode(tmp_path / "node", scale=0.0005), "local_nvme").start()
    try:
        from_sim = _exchange(sim.url, "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", prompt)
    finally:
        sim.stop()
    assert from_real["miss"]["details"] == [] and from_real["hit"]["details"] == ["cached_tokens"]
    assert from_real["reset"] == (200, b"")
    for key in ("miss", "hit", "reset"):
        assert from_sim[key] == from_real[key], key
    for name in READ:
        assert from_sim["metrics"].get(name) == from_real["metrics"].get(name), name
