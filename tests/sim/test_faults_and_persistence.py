"""Fault switches from the node's state file; the disk tier and the fs pool outlive a server."""
import http.client
import json
from urllib.parse import urlsplit

import pytest

from tests.sim.conftest import MODEL, cached, delta, prompt_ids

CONTEXT = 2048


def test_with_the_fx_path_down_requests_recompute_and_hits_return_after(node, servers):
    server = servers(node, "fx")
    context = prompt_ids(CONTEXT)
    server.complete(context)
    node.set_faults(fx_down=True)
    server.reset()
    before = server.metrics()
    down = server.complete(context + prompt_ids(32, 7), max_tokens=3)
    during = server.metrics()
    assert len(down["ids"]) == 3
    assert cached(down["usage"]) == 0
    assert delta(before, during, "vllm:external_prefix_cache_hits_total") == 0
    assert "unreachable (FX path down)" in server.log_text()
    node.set_faults(fx_down=False)
    server.reset()
    back = server.complete(context + prompt_ids(32, 8))
    assert cached(back["usage"]) == CONTEXT


def test_the_server_crashes_mid_stream_after_the_configured_requests(node, servers):
    server = servers(node, "recompute")
    node.set_faults(server_crash_after_requests=1)
    server.complete(prompt_ids(64), max_tokens=2)
    parts = urlsplit(server.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    body = {"model": MODEL, "prompt": prompt_ids(64), "max_tokens": 50, "stream": True}
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    with pytest.raises(http.client.IncompleteRead):
        response.read()
    assert server.process.wait(600) != 0
    assert "simulated crash" in server.log_text()


def test_the_disk_tier_persists_across_a_restart(node, servers):
    first = servers(node, "local_nvme")
    context = prompt_ids(CONTEXT)
    first.complete(context)
    first.stop()
    assert len(list((node.nvme / "lmcache").glob("*.pt"))) == CONTEXT // 256
    second = servers(node, "local_nvme")
    returned = second.complete(context + prompt_ids(16, 3))
    assert cached(returned["usage"]) == CONTEXT


def test_an_fs_pool_on_fx_is_shared_between_instances(node, servers):
    config = {"chunk_size": 256, "local_cpu": False, "remote_url": f"fs://localhost:0{node.fx / 'pool'}"}
    writer = servers(node, "fx", lmcache=config, name="a")
    reader = servers(node, "fx", lmcache=config, name="b")
    context = prompt_ids(CONTEXT, seed=5)
    writer.complete(context)
    writer.stop()    # the pool's files are written by the time a server has stopped
    before = reader.metrics()
    returned = reader.complete(context + prompt_ids(16, 4))
    assert cached(returned["usage"]) == CONTEXT
    assert delta(before, reader.metrics(), "vllm:external_prefix_cache_hits_total") == CONTEXT


def test_greedy_answers_are_the_same_with_and_without_the_cache(node, servers):
    with_cache = servers(node, "fx")
    plain = servers(node, "recompute")
    prompt = prompt_ids(CONTEXT)
    with_cache.complete(prompt, max_tokens=8)
    with_cache.reset()
    hit = with_cache.complete(prompt, max_tokens=8)
    assert cached(hit["usage"]) > 0
    assert hit["ids"] == plain.complete(prompt, max_tokens=8)["ids"]
    sampled = {tuple(plain.complete(prompt, max_tokens=8, temperature=1.0, seed=s)["ids"]) for s in (1, 2)}
    assert len(sampled) == 2
