"""/metrics deltas and LMCache log lines behave as vLLM + LMCache's do, arm by arm."""
import urllib.request

from gates.judge.lmcache_log import parse_log
from tests.sim.conftest import cached, delta, prompt_ids

CONTEXT = 4096


def populate_then_return(server, sessions: int = 2) -> tuple[dict, dict, list[int]]:
    """Write each session once, evict HBM, then send each back with a new turn; counters around the return."""
    contexts = [prompt_ids(CONTEXT, seed) for seed in range(sessions)]
    for context in contexts:
        server.complete(context)
    server.reset()
    before = server.metrics()
    hits = [cached(server.complete(context + prompt_ids(64, 99))["usage"]) for context in contexts]
    return before, server.metrics(), hits


def test_the_recompute_arm_reports_no_hits_at_all(node, servers):
    server = servers(node, "recompute")
    before, after, hits = populate_then_return(server)
    assert delta(before, after, "vllm:prompt_tokens_total") == 2 * (CONTEXT + 64)
    assert delta(before, after, "vllm:prefix_cache_hits_total") == 0
    assert delta(before, after, "vllm:external_prefix_cache_hits_total") == 0
    assert hits == [0, 0]
    assert "LMCache" not in server.log_text()


def test_a_cache_arm_hits_the_disk_tier_for_the_whole_context_after_eviction(node, servers):
    server = servers(node, "fx")
    before, after, hits = populate_then_return(server)
    prompt = delta(before, after, "vllm:prompt_tokens_total")
    assert delta(before, after, "vllm:prefix_cache_hits_total") == 0
    assert delta(before, after, "vllm:external_prefix_cache_hits_total") == 2 * CONTEXT
    assert delta(before, after, "lmcache:num_hit_tokens_total") == 2 * CONTEXT
    assert delta(before, after, "vllm:external_prefix_cache_hits_total") / prompt > 0.98
    assert hits == [CONTEXT, CONTEXT]
    log = server.log_text()
    assert f"Total tokens {CONTEXT + 64}, LMCache hit tokens: {CONTEXT}, need to load: {CONTEXT}" in log


def test_without_eviction_the_gpu_prefix_cache_serves_the_return(node, servers):
    server = servers(node, "local_nvme")
    context = prompt_ids(CONTEXT)
    server.complete(context)
    before = server.metrics()
    server.complete(context + prompt_ids(64, 99))
    after = server.metrics()
    assert delta(before, after, "vllm:prefix_cache_hits_total") == CONTEXT
    assert delta(before, after, "vllm:external_prefix_cache_hits_total") == 0


def test_every_gpu_logs_its_retrieval_at_the_patched_cold_read_rate(node, servers):
    server = servers(node, "fx")
    populate_then_return(server, sessions=1)
    records = parse_log(server.log_text(), run_id="t", arm="fx", simulated=True)
    assert sorted(r["gpu"] for r in records) == list(range(8))
    assert all(r["tokens"] == CONTEXT and r["gbps"] >= 5.0 for r in records)


def test_without_the_parallel_read_patch_a_gpu_reads_below_one_gb_per_second(node, servers):
    config = {"chunk_size": 256, "local_cpu": False, "max_local_disk_size": 50,
              "local_disk": f"file://{node.fx / 'lmcache'}", "extra_config": {"parallel_read": False}}
    server = servers(node, "fx", lmcache=config)
    populate_then_return(server, sessions=1)
    records = parse_log(server.log_text(), run_id="t", arm="fx", simulated=True)
    assert records and all(r["gbps"] < 1.0 for r in records)


def test_a_small_dram_tier_overflows_so_returns_come_from_disk(node, servers):
    per_rank_chunk = 256 * 126976 / 8
    config = {"chunk_size": 256, "local_cpu": True, "max_local_cpu_size": 20 * per_rank_chunk / 2**30,
              "max_local_disk_size": 50, "local_disk": f"file://{node.nvme / 'lmcache'}"}
    server = servers(node, "local_nvme", lmcache=config)
    populate_then_return(server, sessions=3)
    metrics = server.metrics()
    assert metrics['fxpilot_sim_tier_hit_tokens_total{tier="local_disk"}'] >= 2 * CONTEXT


def test_reset_prefix_cache_exists_only_in_dev_mode(node, servers):
    server = servers(node, "fx", dev_mode=False)
    status, _, _ = server.post("/reset_prefix_cache")
    assert status == 404
    with urllib.request.urlopen(server.url + "/health") as response:
        assert response.status == 200 and response.headers["X-Fxpilot-Simulated"] == "1"


def test_layerwise_retrieval_lines_carry_tokens_but_no_bandwidth_as_lmcache_writes_them(node, servers):
    # LMCache 0.5.x retrieve_layer: "[req_id=…] Retrieved N out of M out of total T tokens", nothing else
    config = {"chunk_size": 256, "local_cpu": False, "max_local_disk_size": 50, "use_layerwise": True,
              "local_disk": f"file://{node.fx / 'lmcache'}"}
    server = servers(node, "fx", lmcache=config)
    populate_then_return(server, sessions=1)
    lines = [line for line in server.log_text().splitlines() if "Retrieved" in line]
    assert lines and all(" out of total " in line and "throughput" not in line for line in lines)
    records = parse_log(server.log_text(), run_id="t", arm="fx", simulated=True)
    assert sorted(r["gpu"] for r in records) == list(range(8))
    assert all(r["tokens"] == CONTEXT and r["gbps"] is None and not r["bandwidth_logged"] for r in records)
