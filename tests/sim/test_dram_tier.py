"""LMCache 0.5.6's DRAM tier, its internal API server's cache clear, the staging pool and the device counters, on
values: hits by tier, bytes counted on the node's diskstats, what a clear empties, a pool too small for a retrieval."""
from __future__ import annotations

import hashlib
import http.client
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request

from runners.sim import diskstats
from runners.sim.nonehash import none_hash
from tests.sim.conftest import SimServer, cached, delta, prompt_ids

CONTEXT = 4096                      # 16 chunks of 256 tokens
KV_PER_TOKEN = 126976               # fp8, Qwen3-Coder-480B (docs/simulator.md)
RANK_CHUNK = 256 * KV_PER_TOKEN // 8
HANG_BOUND = 600                    # seconds: waits are for events, never a short deadline


def port_range(count: int) -> int:
    """The first of ``count`` consecutive loopback ports nobody listens on now."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            start = probe.getsockname()[1]
        if start + count >= 65000:
            continue
        try:
            sockets = []
            for port in range(start, start + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return start
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError("no range of free ports")


def config(node, *, local_cpu: bool, cpu_chunks: float, where: str = "fx", api_port: int | None = None) -> dict:
    settings = {"chunk_size": 256, "local_cpu": local_cpu, "max_local_cpu_size": cpu_chunks * RANK_CHUNK / 2**30,
                "max_local_disk_size": 50, "pre_caching_hash_algorithm": "sha256_cbor",
                "local_disk": f"file://{(node.fx if where == 'fx' else node.nvme) / 'lmcache'}",
                "extra_config": {"use_odirect": True}}
    if api_port is not None:
        settings.update(internal_api_server_enabled=True, internal_api_server_host="127.0.0.1",
                        internal_api_server_port_start=api_port)
    return settings


def delete(url: str) -> tuple[int, dict | str]:
    request = urllib.request.Request(url, method="DELETE")
    try:
        with urllib.request.urlopen(request, timeout=HANG_BOUND) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        body = error.read()
        try:
            return error.code, json.loads(body)
        except ValueError:
            return error.code, body.decode()


def start(node, servers, tmp_path, settings: dict, **env):
    stats = diskstats.ensure(tmp_path / "proc-diskstats")
    server = servers(node, "fx", lmcache=settings, env={"FXPILOT_DISKSTATS": str(stats), "PYTHONHASHSEED": "0", **env})
    return server, stats


def sectors(stats, device: str = "nvme1n1") -> int:
    return diskstats.sectors_read(stats, device)


def wait_for(predicate, what: str):
    deadline = time.monotonic() + HANG_BOUND
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"never happened within {HANG_BOUND} s: {what}")


def tier_tokens(metrics: dict, tier: str) -> float:
    return metrics.get(f'fxpilot_sim_tier_hit_tokens_total{{tier="{tier}"}}', 0.0)


def test_a_return_hits_dram_first_and_after_the_clear_reads_the_disk_tier_with_its_bytes_counted(node, servers,
                                                                                                   tmp_path):
    api = port_range(9)
    server, stats = start(node, servers, tmp_path, config(node, local_cpu=True, cpu_chunks=64, api_port=api))
    context = prompt_ids(CONTEXT)
    server.complete(context)
    wait_for(lambda: len(list((node.fx / "lmcache").glob("*.pt"))) == 16, "the 16 chunk files written")

    # HBM emptied, DRAM kept: the return is a DRAM hit and the FX namespace reads nothing
    server.reset()
    before, read_before = server.metrics(), sectors(stats)
    assert cached(server.complete(context + prompt_ids(64, 99))["usage"]) == CONTEXT
    after = server.metrics()
    assert delta(before, after, 'fxpilot_sim_tier_hit_tokens_total{tier="dram"}') == CONTEXT
    assert tier_tokens(after, "local_disk") == 0
    assert sectors(stats) == read_before

    # every worker's DRAM emptied through LMCache's internal API server (worker i on port_start + 1 + i)
    for rank in range(8):
        status, body = delete(f"http://127.0.0.1:{api + 1 + rank}/cache/clear?locations=LocalCPUBackend")
        assert status == 200 and body == {"status": "success", "num_removed": CONTEXT}, body
    server.reset()
    before, read_before = server.metrics(), sectors(stats)
    assert cached(server.complete(context + prompt_ids(64, 98))["usage"]) == CONTEXT
    after = server.metrics()
    assert delta(before, after, 'fxpilot_sim_tier_hit_tokens_total{tier="local_disk"}') == CONTEXT
    assert delta(before, after, 'fxpilot_sim_tier_hit_tokens_total{tier="dram"}') == 0
    # 16 chunks × 256 tokens × 126,976 B, in 512-byte sectors, on the device findmnt names for the FX mount
    assert sectors(stats) - read_before == CONTEXT * KV_PER_TOKEN // 512
    assert diskstats.sectors_read(stats, "nvme0n1") == diskstats.sectors_read(
        diskstats.ensure(tmp_path / "fresh"), "nvme0n1")

    # the disk hit was promoted to DRAM, as StorageManager.batched_get does
    server.reset()
    before, read_before = server.metrics(), sectors(stats)
    server.complete(context + prompt_ids(64, 97))
    assert delta(before, server.metrics(), 'fxpilot_sim_tier_hit_tokens_total{tier="dram"}') == CONTEXT
    assert sectors(stats) == read_before


def test_the_clear_answers_as_lmcache_0_5_6_for_the_scheduler_other_locations_and_wrong_requests(node, servers,
                                                                                                  tmp_path):
    api = port_range(9)
    server, _ = start(node, servers, tmp_path, config(node, local_cpu=True, cpu_chunks=64, api_port=api))
    context = prompt_ids(CONTEXT)
    server.complete(context)
    # the scheduler's server (port_start) has no LMCache engine
    assert delete(f"http://127.0.0.1:{api}/cache/clear?locations=LocalCPUBackend") == (
        503, {"error": "LMCache API is unavailable", "message": "LMCache engine not configured."})
    # only LocalCPUBackend can be cleared; the disk backend is skipped with a warning
    assert delete(f"http://127.0.0.1:{api + 1}/cache/clear?locations=LocalDiskBackend") == (
        200, {"status": "success", "num_removed": 0})
    assert delete(f"http://127.0.0.1:{api + 1}/cache/clear?locations=Nothing") == (
        200, {"status": "success", "num_removed": 0})
    assert "Storage backend LocalDiskBackend does not support clear operation. Skipping." in server.log_text()
    # no locations: every backend, so rank 1's DRAM goes
    assert delete(f"http://127.0.0.1:{api + 2}/cache/clear") == (200, {"status": "success", "num_removed": CONTEXT})
    status, _ = delete(f"http://127.0.0.1:{api + 1}/cache/nothing")
    assert status == 404
    request = urllib.request.Request(f"http://127.0.0.1:{api + 1}/cache/clear", method="GET")
    try:
        urllib.request.urlopen(request, timeout=HANG_BOUND)
        raise AssertionError("GET was accepted")
    except urllib.error.HTTPError as error:
        assert error.code == 405
    # a rank without the chunks in DRAM: the return reads every chunk from disk (the lookup needs all ranks)
    server.reset()
    before = server.metrics()
    server.complete(context + prompt_ids(64, 99))
    assert delta(before, server.metrics(), 'fxpilot_sim_tier_hit_tokens_total{tier="local_disk"}') == CONTEXT


def test_with_local_cpu_false_the_clear_removes_nothing_and_every_hit_is_read_from_disk(node, servers, tmp_path):
    api = port_range(9)
    server, stats = start(node, servers, tmp_path, config(node, local_cpu=False, cpu_chunks=64, api_port=api))
    context = prompt_ids(CONTEXT)
    server.complete(context)
    assert delete(f"http://127.0.0.1:{api + 1}/cache/clear?locations=LocalCPUBackend") == (
        200, {"status": "success", "num_removed": 0})
    wait_for(lambda: len(list((node.fx / "lmcache").glob("*.pt"))) == 16, "the 16 chunk files written")
    server.reset()
    read_before = sectors(stats)
    assert cached(server.complete(context + prompt_ids(64, 99))["usage"]) == CONTEXT
    assert tier_tokens(server.metrics(), "local_disk") == CONTEXT
    assert sectors(stats) - read_before == CONTEXT * KV_PER_TOKEN // 512


def _stalls(node, servers, tmp_path, local_cpu: bool):
    # a CPU pool of 10 chunks per rank against a retrieval of 16: LMCache stages all 16 before reading any
    server, _ = start(node, servers, tmp_path, config(node, local_cpu=local_cpu, cpu_chunks=10.5))
    context = prompt_ids(CONTEXT)
    server.complete(context)
    wait_for(lambda: len(list((node.fx / "lmcache").glob("*.pt"))) == 16, "the 16 chunk files written")
    server.reset()
    returning = threading.Thread(target=lambda: _quietly(server.complete, context + prompt_ids(64, 99)), daemon=True)
    returning.start()
    wait_for(lambda: "No eviction candidates found in local cpu backend" in server.log_text(), "the stall's warning")
    assert server.metrics()["fxpilot_sim_staging_stalled"] == 1
    assert re.search(r"stages 16 chunks per rank .* in a CPU pool of 10 chunks per rank", server.log_text())
    assert returning.is_alive()  # the request waits with the server; it ends when the server is stopped


def _quietly(function, *args):
    try:
        function(*args)
    except (OSError, AssertionError, http.client.HTTPException):
        pass  # the server was stopped under the waiting request


def test_a_staging_pool_smaller_than_one_retrieval_stalls_the_server(node, servers, tmp_path):
    _stalls(node, servers, tmp_path, local_cpu=False)


def test_a_dram_tier_smaller_than_one_retrieval_stalls_it_too(node, servers, tmp_path):
    _stalls(node, servers, tmp_path, local_cpu=True)


def test_every_lmcache_process_logs_the_none_hash_of_its_algorithm_and_seed_and_o_direct(node, servers, tmp_path):
    server, _ = start(node, servers, tmp_path, config(node, local_cpu=True, cpu_chunks=64))
    values = re.findall(r"Initialized NONE_HASH=(-?\d+) from vLLM", server.log_text())
    # the scheduler and eight workers; sha256 of canonical CBOR of the text "0", its first 8 bytes big-endian
    expected = int.from_bytes(hashlib.sha256(b"\x61" + b"0").digest()[:8], "big")
    assert values == [str(expected)] * 9
    assert none_hash("sha256_cbor", "0") == expected
    assert server.log_text().count("Using O_DIRECT for disk I/O: True") == 8


def test_without_pythonhashseed_each_process_draws_its_own_none_hash(node, tmp_path):
    stats = diskstats.ensure(tmp_path / "proc-diskstats")
    server = SimServer(node, "fx", lmcache=config(node, local_cpu=True, cpu_chunks=64),
                       env={"FXPILOT_DISKSTATS": str(stats)})
    server.env.pop("PYTHONHASHSEED", None)
    try:
        server.start()
        values = re.findall(r"Initialized NONE_HASH=(-?\d+)", server.log_text())
        assert len(values) == 9 and len(set(values)) == 9
        assert server.log_text().count("PYTHONHASHSEED is not set") == 9
    finally:
        server.stop()


def test_the_dram_arm_serves_returns_from_dram_alone_and_reads_no_device(node, servers, tmp_path):
    api = port_range(9)
    settings = {"chunk_size": 256, "local_cpu": True, "max_local_cpu_size": 64 * RANK_CHUNK / 2**30,
                "pre_caching_hash_algorithm": "sha256_cbor", "internal_api_server_enabled": True,
                "internal_api_server_port_start": api}
    server, stats = start(node, servers, tmp_path, settings)
    before_stats = stats.read_text()
    context = prompt_ids(CONTEXT)
    server.complete(context)
    server.reset()
    assert cached(server.complete(context + prompt_ids(64, 99))["usage"]) == CONTEXT
    assert tier_tokens(server.metrics(), "dram") == CONTEXT
    assert stats.read_text() == before_stats              # no disk tier: nothing read, nothing written
    assert "Using O_DIRECT" not in server.log_text()
    for rank in range(8):
        assert delete(f"http://127.0.0.1:{api + 1 + rank}/cache/clear?locations=LocalCPUBackend")[0] == 200
    server.reset()
    assert cached(server.complete(context + prompt_ids(64, 98))["usage"]) == 0   # DRAM emptied: recomputed
