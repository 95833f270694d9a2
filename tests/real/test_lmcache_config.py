"""Every LMCache arm's rendered YAML (the fx arm's with the shared pool too) read by LMCache's own config loader
(lmcache 0.5.6 in the engine environment): every key taken, with the value fxpilot meant, and no warning about an
unknown key or a bad type (that loader only warns). The local_nvme arm's YAML also serves for real in
test_real_engine.py."""
from __future__ import annotations

import json
import subprocess

import pytest

from runners.config import default_simulated, validate_deployment
from runners.lmcache import render_lmcache_config

pytestmark = pytest.mark.real_engine

LOAD = r'''
import json, logging, sys
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
from lmcache.v1.config import LMCacheEngineConfig
for name in list(logging.root.manager.loggerDict):
    if name.startswith("lmcache"):
        logging.getLogger(name).addHandler(Keep())
out = {}
for path in sys.argv[1:]:
    del records[:]
    config = LMCacheEngineConfig.from_file(path)
    config.validate()
    extra = config.extra_config or {}
    out[path] = {"chunk_size": config.chunk_size, "local_cpu": config.local_cpu,
                 "max_local_cpu_size": config.max_local_cpu_size, "local_disk": config.local_disk,
                 "max_local_disk_size": config.max_local_disk_size, "remote_url": config.remote_url,
                 "pre_caching_hash_algorithm": config.pre_caching_hash_algorithm,
                 "use_odirect": extra.get("use_odirect"), "fs_connector_use_odirect": extra.get("fs_connector_use_odirect"),
                 "internal_api_server_enabled": config.internal_api_server_enabled,
                 "internal_api_server_host": config.internal_api_server_host,
                 "internal_api_server_port_start": config.internal_api_server_port_start,
                 "warnings": [m for m in records if "unknown" in m.lower() or "invalid" in m.lower()]}
print(json.dumps(out))
'''
ARMS = ("dram", "local_nvme", "fx")


@pytest.fixture(scope="module")
def loaded(engine, tmp_path_factory) -> dict:
    """Both cache arms' rendered YAML, read by one run of LMCache's loader (importing LMCache takes seconds)."""
    settings = validate_deployment(default_simulated()).with_home("/home/fxpilot")
    folder = tmp_path_factory.mktemp("lmcache-yaml")
    paths = {}
    for arm in ARMS:
        paths[arm] = folder / f"{arm}.yaml"
        paths[arm].write_text(render_lmcache_config(settings, arm, run_id="abc123", share_pool=arm == "fx"))
    result = subprocess.run([str(engine.python), "-c", LOAD, *map(str, paths.values())], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    return {arm: out[str(path)] for arm, path in paths.items()}


@pytest.mark.parametrize("arm", ARMS)
def test_lmcaches_own_loader_takes_the_rendered_yaml(loaded, arm):
    loaded = loaded[arm]
    # the DRAM tier on, and the internal API server on loopback (the cold windows empty DRAM through it)
    assert (loaded["chunk_size"], loaded["local_cpu"], loaded["max_local_cpu_size"]) == (256, True, 1.0)
    assert (loaded["internal_api_server_enabled"], loaded["internal_api_server_host"]) == (True, "127.0.0.1")
    assert loaded["internal_api_server_port_start"] >= 1024 and loaded["warnings"] == []
    assert loaded["pre_caching_hash_algorithm"] == "sha256_cbor"     # not LMCache's default, builtin
    if arm == "dram":
        assert loaded["local_disk"] is None and loaded["remote_url"] is None and loaded["use_odirect"] is None
        return
    root = "/home/fxpilot/mnt/nvme0/fxpilot/kv" if arm == "local_nvme" else "/home/fxpilot/mnt/fx/fxpilot/kv"
    assert loaded["local_disk"].rstrip("/").endswith(f"{root}/abc123")
    assert loaded["max_local_disk_size"] == 200.0 and loaded["use_odirect"] is True
    if arm == "fx":
        # the fs connector of the shared pool reads its own O_DIRECT key
        assert loaded["remote_url"] == "fs://localhost:0/home/fxpilot/mnt/fx/fxpilot-shared/abc123"
        assert loaded["fs_connector_use_odirect"] is True
    else:
        assert loaded["remote_url"] is None and loaded["fs_connector_use_odirect"] is None


def test_the_probes_lookup_finds_the_real_lmcache_056(engine):
    """The LMCache lookup probe.sh and deploy.sh run (lmcache_inspect.py) on a real 0.5.6 install (no c_ops, no
    __commit__)."""
    from tests.deploy.test_lmcache_lookup import lookup_code

    result = subprocess.run([str(engine.python), "-c", lookup_code()], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert (found["installed"], found["version"], found["commit"], found["commit_from"]) == (True, "0.5.6", "3e11e108",
                                                                                            "_version.py")
    assert found["hip"] is False and found["native"].startswith("cuda_ops.")
    # 0.5.6 serves DELETE /cache/clear on its internal API server (what the cold windows empty DRAM with), and its
    # fingerprint names the build with LocalDiskBackend's own default of 4 disk I/O threads
    assert found["clear_api"] is True
    fingerprint = found["fingerprint"]
    assert (fingerprint["version"], fingerprint["commit"], fingerprint["disk_io_threads"]) == ("0.5.6", "3e11e108", 4)
    assert len(fingerprint["sha256"]) == 64 and fingerprint["files"] > 800


CAPPED = r'''
import asyncio, json, os, sys
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
config = LMCacheEngineConfig.from_file(sys.argv[1])
backend = LocalDiskBackend(config, asyncio.new_event_loop(), None, dst_device="cpu")
print(json.dumps({"max_cache_size": backend.max_cache_size}), flush=True)
os._exit(0)  # its disk worker threads would wait on a loop that never runs
'''


def test_g4s_capped_disk_tier_holds_exactly_the_chunks_it_names_in_real_lmcaches_disk_backend(engine, tmp_path):
    """LMCache 0.5.6 reads max_local_disk_size as GiB (2³⁰ bytes) per rank: the size G4's capacity check renders
    (runners.lmcache.disk_size_for) is what real LMCache's disk backend caps itself at, and that cap holds exactly the
    whole chunks meant. Read as 10⁹ bytes the same YAML would hold 7 % more chunks than the oracle's capacity."""
    from runners.lmcache import kv_bytes_per_token

    settings = validate_deployment(default_simulated()).with_home(str(tmp_path))
    chunks, chunk = 100, settings.sizes.chunk_size
    path = tmp_path / "capped.yaml"
    path.write_text(render_lmcache_config(settings, "fx", run_id="cap1", capacity_tokens=chunks * chunk + chunk // 3))
    assert f"({chunks} chunks of {chunk})" in path.read_text()
    result = subprocess.run([str(engine.python), "-c", CAPPED, str(path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    limit = json.loads(result.stdout.strip().splitlines()[-1])["max_cache_size"]
    rank_chunk = int(chunk * kv_bytes_per_token(settings, False) / settings.tensor_parallel_size)
    assert limit // rank_chunk == chunks, (limit, rank_chunk)
