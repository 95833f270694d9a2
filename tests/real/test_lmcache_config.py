"""Both cache arms' rendered YAML (the fx arm's with the shared pool too) read by LMCache's own config loader
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
                 "warnings": [m for m in records if "unknown" in m.lower() or "invalid" in m.lower()]}
print(json.dumps(out))
'''
ARMS = ("local_nvme", "fx")


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
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    return {arm: out[str(path)] for arm, path in paths.items()}


@pytest.mark.parametrize("arm", ARMS)
def test_lmcaches_own_loader_takes_the_rendered_yaml(loaded, arm):
    loaded = loaded[arm]
    root = "/home/fxpilot/mnt/nvme0/fxpilot/kv" if arm == "local_nvme" else "/home/fxpilot/mnt/fx/fxpilot/kv"
    assert loaded["local_disk"].rstrip("/").endswith(f"{root}/abc123")
    assert (loaded["chunk_size"], loaded["local_cpu"], loaded["max_local_cpu_size"], loaded["max_local_disk_size"]) \
        == (256, False, 0.25, 200.0)
    assert loaded["use_odirect"] is True and loaded["warnings"] == []
    assert loaded["pre_caching_hash_algorithm"] == "sha256_cbor"     # not LMCache's default, builtin
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

    result = subprocess.run([str(engine.python), "-c", lookup_code()], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert (found["installed"], found["version"], found["commit"], found["commit_from"]) == (True, "0.5.6", "3e11e108",
                                                                                            "_version.py")
    assert found["hip"] is False and found["native"].startswith("cuda_ops.")
