"""The protocol contract: the same requests to the simulated server and to real vLLM 0.20.1 (its cache arm running
the real LMCache), and what fxpilot reads must agree — streamed chunk fields, usage and prompt_tokens_details on a
miss and on a hit, the reset answer, /health and /v1/models, the /metrics names and labels the workload client and
the judge read, and the values of the counters the judge reads for a miss, a GPU prefix-cache hit and a hit from
the external tier."""
from __future__ import annotations

import json
import time
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
    with urllib.request.urlopen(request, timeout=600) as response:
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
    with urllib.request.urlopen(url + "/metrics", timeout=600) as response:
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
    # Real LMCache stores the prompt's chunks after the request (to its DRAM tier, which the product's YAML turns on,
    # and to its disk tier in the background): a request sent the moment the first one ended may find nothing yet.
    # The product never asks that fast (populate, then the eviction step, then measure); the answer's shape is
    # compared once a tier holds it.
    for _ in range(HIT_TRIES):
        status, body = _post(url, "/reset_prefix_cache")
        hit = _shape(_stream(url, model, prompt))
        if hit["details"]:
            break
        time.sleep(1.0)
    return {"miss": miss, "reset": (status, body), "hit": hit, "metrics": _metric_labels(url)}


HIT_TRIES = 30  # one a second: the disk tier's background write of a 1,030-token prompt


def _both(real_servers, tmp_path, ask, prompt: list[int]) -> tuple[dict, dict]:
    """ask(url, model, prompt) of the real cache arm, then of a simulated server of the same arm."""
    real = real_servers.local_nvme
    with urllib.request.urlopen(real.url + "/v1/models", timeout=600) as response:
        model = json.loads(response.read())["data"][0]["id"]
    from_real = ask(real.url, model, prompt)
    sim = SimServer(SimNode(tmp_path / "node", scale=0.0005), "local_nvme").start()
    try:
        return from_real, ask(sim.url, "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", prompt)
    finally:
        sim.stop()


def test_the_simulator_answers_in_the_shapes_real_vllm_0201_answers_in(real_servers, tmp_path):
    prompt = [20000 + (i * 7919) % 9000 for i in range(PROMPT_TOKENS)]
    from_real, from_sim = _both(real_servers, tmp_path, _exchange, prompt)
    assert from_real["miss"]["details"] == [] and from_real["hit"]["details"] == ["cached_tokens"]
    assert from_real["reset"] == (200, b"")
    for key in ("miss", "hit", "reset"):
        assert from_sim[key] == from_real[key], key
    for name in READ:
        assert from_sim["metrics"].get(name) == from_real["metrics"].get(name), name


# The counters whose deltas the judge reads (gates/judge/counters.py, validity.py): a miss, a hit from the GPU prefix
# cache (the same prompt again) and a hit from the external tier (again after a prefix-cache reset).
JUDGED = ("vllm:prompt_tokens_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
          "vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total",
          "vllm:generation_tokens_total")


def _counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=600) as response:
        return workload.parse_metrics(response.read().decode())


def _deltas(url: str, model: str, prompt: list[int]) -> dict:
    out = {}
    for case in ("miss", "gpu_hit", "external_hit"):
        if case == "external_hit":
            _post(url, "/reset_prefix_cache")
        before = _counters(url)
        events = _stream(url, model, prompt)
        after = _counters(url)
        missing = [name for name in JUDGED if name not in after]
        out[case] = {"missing": missing, "usage": events[-1]["usage"],
                     **{name: after.get(name, 0) - before.get(name, 0) for name in JUDGED if name in after}}
    with urllib.request.urlopen(url + "/health", timeout=600) as response:
        out["health"] = (response.status, response.read())
    with urllib.request.urlopen(url + "/v1/models", timeout=600) as response:
        models = json.loads(response.read())
    # the simulator also says what it is (`simulated`), as in its stream events
    card = models["data"][0]
    out["models"] = (sorted(set(models) - {"simulated"}), sorted(card), models["object"], card["object"],
                     [sorted(p) for p in card.get("permission") or []])
    return out


def test_the_simulator_counts_a_miss_a_gpu_hit_and_an_external_hit_as_real_vllm_with_lmcache_does(real_servers,
                                                                                                 tmp_path):
    prompt = [30000 + (i * 104729) % 9000 for i in range(PROMPT_TOKENS)]   # a prompt no other test sent
    from_real, from_sim = _both(real_servers, tmp_path, _deltas, prompt)
    for case in ("miss", "gpu_hit", "external_hit"):
        assert from_real[case]["missing"] == [] and from_sim[case]["missing"] == [], (case, from_real, from_sim)
        assert from_sim[case] == from_real[case], case
    # what the values are, on both: the whole prompt counted, hits only where the case says
    assert from_real["miss"]["vllm:prompt_tokens_total"] == PROMPT_TOKENS
    assert from_real["miss"]["vllm:prefix_cache_hits_total"] == from_real["miss"]["vllm:external_prefix_cache_hits_total"] == 0
    assert from_real["gpu_hit"]["vllm:prefix_cache_hits_total"] > 0 == from_real["gpu_hit"]["vllm:external_prefix_cache_hits_total"]
    assert from_real["external_hit"]["vllm:external_prefix_cache_hits_total"] > 0 == from_real["external_hit"][
        "vllm:prefix_cache_hits_total"]
    assert from_sim["health"] == from_real["health"] and from_sim["models"] == from_real["models"]
