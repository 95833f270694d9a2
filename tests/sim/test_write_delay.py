"""The disk write's visibility delay, in model time, as LMCache 0.5.6 has it: a stored chunk is found on disk only once
its write is done (LocalDiskBackend indexes a key after async_save_bytes_to_disk wrote its file)."""
from __future__ import annotations

import numpy as np

from runners.sim.config import parse_serve
from runners.sim.server import SimServer
from runners.sim.tiers import DiskTier, Writer
from runners.simnode.storage import fx_write_gbps
from tests.sim.conftest import MODEL, TRANSFER, prompt_ids

KV_PER_TOKEN = 126976


def test_a_disk_tier_key_is_invisible_until_its_write_completes(tmp_path):
    tier = DiskTier("local_disk", tmp_path / "disk", 10, 256, 4, Writer())
    assert tier.put_many(["a", "b"], {"a": 5.0, "b": 7.5}) == 2
    assert not tier.visible("a", 4.999) and tier.visible("a", 5.0)
    assert not tier.visible("b", 7.0) and tier.visible("b", 7.5)
    tier.writer.flush()


def _server(node, tmp_path, local_cpu: bool) -> SimServer:
    config = tmp_path / "lmcache.yaml"
    config.write_text(f"chunk_size: 256\nlocal_cpu: {str(local_cpu).lower()}\nmax_local_cpu_size: 5\n"
                      f"local_disk: file://{node.fx / 'lmcache'}\nmax_local_disk_size: 50\n")
    serve = parse_serve([MODEL, "--tensor-parallel-size", "8", "--kv-transfer-config", TRANSFER],
                        {"LMCACHE_CONFIG_FILE": str(config), "FXPILOT_SIM_ROOT": str(node.root)})
    return SimServer(serve)


def test_chunks_written_after_each_prefill_step_become_readable_one_write_time_apart(node, tmp_path):
    server = _server(node, tmp_path, local_cpu=False)
    prompt = np.array(prompt_ids(4096), dtype=np.uint32)
    request = server.lookup("cmpl-1", prompt, prompt.tobytes())
    # as the engine leaves it: 4096 tokens prefilled in two steps of 2048, ending at t = 10 s and t = 11 s
    request.prefill_marks = [(2048, 10.0), (4096, 11.0)]
    request.first_token_at = 11.0
    server.store("cmpl-1", request)
    write = 256 * KV_PER_TOKEN / (fx_write_gbps({}) * 1e9)   # one chunk, every rank, at the FX write bandwidth
    disk = server.tiers[0]
    keys = request.keys[1]
    # chunks 0–7 are queued at 10 s, one after another; chunks 8–15 at 11 s behind them
    assert abs(disk.ready[keys[0]] - (10.0 + write)) < 1e-9
    assert abs(disk.ready[keys[7]] - (10.0 + 8 * write)) < 1e-9
    assert abs(disk.ready[keys[15]] - (max(11.0, 10.0 + 8 * write) + 8 * write)) < 1e-9

    returning = np.array(prompt_ids(4096) + prompt_ids(8, 9), dtype=np.uint32)

    def hits_at(now: float) -> int:
        server.hbm.clear()
        server.engine.now = now
        return server.lookup("cmpl-2", returning, returning.tobytes()).cached_disk

    assert hits_at(10.0) == 0                       # nothing written yet
    assert hits_at(10.0 + 3.5 * write) == 3 * 256   # the first three chunks' writes are done
    assert hits_at(disk.ready[keys[15]]) == 4096    # every write done
    server.writer.flush()


def test_with_dram_on_a_chunk_is_found_in_dram_at_once_while_its_disk_write_is_in_flight(node, tmp_path):
    server = _server(node, tmp_path, local_cpu=True)
    prompt = np.array(prompt_ids(4096), dtype=np.uint32)
    request = server.lookup("cmpl-1", prompt, prompt.tobytes())
    request.prefill_marks = [(4096, 10.0)]
    request.first_token_at = 10.0
    server.store("cmpl-1", request)
    server.engine.now = 10.0
    server.hbm.clear()
    returning = np.array(prompt_ids(4096) + prompt_ids(8, 9), dtype=np.uint32)
    found = server.lookup("cmpl-2", returning, returning.tobytes())
    assert (found.cached_dram, found.cached_disk) == (4096, 0)
    server.writer.flush()
