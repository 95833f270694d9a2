"""The LMCache arm stays simulated (LMCache cannot serve on a CPU), but its rendered YAML is read by LMCache's
own config loader (lmcache 0.5.6 in the engine environment): every key taken, with the value fxpilot meant,
and no warning about an unknown key or a bad type (that loader only warns)."""
from __future__ import annotations

import json
import subprocess

import pytest

from runners.config import default_simulated, validate_deployment
from runners.deploy import render_lmcache_config

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
config = LMCacheEngineConfig.from_file(sys.argv[1])
config.validate()
extra = config.extra_config or {}
print(json.dumps({"chunk_size": config.chunk_size, "local_cpu": config.local_cpu,
                  "max_local_cpu_size": config.max_local_cpu_size, "local_disk": config.local_disk,
                  "max_local_disk_size": config.max_local_disk_size, "remote_url": config.remote_url,
                  "use_odirect": extra.get("use_odirect"), "fs_connector_use_odirect": extra.get("fs_connector_use_odirect"),
                  "warnings": [m for m in records if "unknown" in m.lower() or "invalid" in m.lower()]}))
'''


@pytest.mark.parametrize("arm", ["local_nvme", "fx"])
def test_lmcaches_own_loader_takes_the_rendered_yaml(engine, arm, tmp_path):
    settings = validate_deployment(default_simulated()).with_home("/home/fxpilot")
    path = tmp_path / f"{arm}.yaml"
    path.write_text(render_lmcache_config(settings, arm, run_id="abc123", share_pool=arm == "fx"))
    result = subprocess.run([str(engine.python), "-c", LOAD, str(path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    root = "/home/fxpilot/mnt/nvme0/fxpilot/kv" if arm == "local_nvme" else "/home/fxpilot/mnt/fx/fxpilot/kv"
    assert loaded["local_disk"].rstrip("/").endswith(f"{root}/abc123")
    assert (loaded["chunk_size"], loaded["local_cpu"], loaded["max_local_cpu_size"], loaded["max_local_disk_size"]) \
        == (256, True, 0.25, 200.0)
    assert loaded["use_odirect"] is True and loaded["warnings"] == []
    if arm == "fx":
        # the fs connector of the shared pool reads its own O_DIRECT key
        assert loaded["remote_url"] == "fs://localhost:0/home/fxpilot/mnt/fx/fxpilot-shared/abc123"
        assert loaded["fs_connector_use_odirect"] is True
    else:
        assert loaded["remote_url"] is None and loaded["fs_connector_use_odirect"] is None
