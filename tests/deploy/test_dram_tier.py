"""LMCache's DRAM tier as production runs it: the sizing preflight, the node-memory and clear-API refusals, the
observed first-block hash and O_DIRECT lines, the fingerprint the plan may pin."""
from __future__ import annotations

import http.server
import json
import re
import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest
import yaml

from gates.plan import PLANS_DIR
from runners.config import default_simulated, validate_deployment
from runners.deployment import DeployError, Deployment
from runners.lmcache import LMCACHE_TROUBLE, expected_none_hash, sizing
from tests.deploy.test_deploy_script import arm_params

GIB = 1024 ** 3


@pytest.fixture
def settings():
    return validate_deployment(default_simulated()).with_home("/home/fxpilot")


def default_plan() -> dict:
    return yaml.safe_load((PLANS_DIR / "default.yaml").read_text(encoding="utf-8"))


def test_the_default_plans_largest_retrieval_is_the_issues_figure_and_the_simulated_pool_holds_it(settings):
    found = sizing(settings, "fx", simulated=True, plan_document=default_plan())
    # 49,152 + 256 tokens = 193 chunks of 256; Qwen3-Coder-480B fp8: 2 × 62 layers × 8 KV heads × 128 × 1 B; ÷ TP 8
    assert found["tokens"] == 49408 and found["kv_dtype"] == "fp8" and found["kv_bytes_per_token"] == 126976
    assert found["retrieval_bytes"] == 193 * 256 * 126976 // 8 and round(found["retrieval_bytes"] / GIB, 2) == 0.73
    assert found["ok"] and found["pool_bytes"] == GIB  # the simulated default of 1 GiB per rank


def test_a_pool_below_one_retrieval_is_refused_naming_both_sizes(settings):
    small = replace(settings, sizes=replace(settings.sizes, max_local_cpu_size=0.25))
    found = sizing(small, "dram", simulated=True, plan_document=default_plan())
    assert not found["ok"]
    assert "max_local_cpu_size is 0.250 GiB (268435456 B) per rank" in found["message"]
    assert "0.730 GiB (784203776 B)" in found["message"] and "+ 25 % = 0.913 GiB" in found["message"]
    # bf16 KV (the model's activation dtype on a real node without --kv-cache-dtype) doubles it
    assert sizing(small, "fx", simulated=False, plan_document=default_plan())["retrieval_bytes"] == 2 * 784203776
    assert sizing(small, "recompute", simulated=True, plan_document=default_plan())["ok"]


def test_without_a_plan_the_max_model_len_bounds_the_retrieval_and_a_model_path_is_read_from_its_config(settings):
    tiny = replace(settings, model="/models/tiny", tensor_parallel_size=1,
                   extra_vllm_flags=("--max-model-len=4096",), sizes=replace(settings.sizes, max_local_cpu_size=0.001))
    config = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64,
              "hidden_size": 128, "torch_dtype": "bfloat16"}
    found = sizing(tiny, "fx", simulated=False, model_config_json=config)
    assert found["tokens"] == 4096 and found["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 2
    assert found["retrieval_bytes"] == 4096 * 1024 and not found["ok"]
    assert "4.000 MiB (4194304 B)" in found["message"] and "vLLM's --max-model-len=4096" in found["message"]
    with pytest.raises(ValueError, match="not known"):
        sizing(tiny, "fx", simulated=False)


def test_the_expected_none_hash_is_vllms_first_block_hash_as_lmcache_logs_it():
    # Values of vLLM 0.20.1's sha256_cbor / sha256 (cbor2 / pickle of the seed string), folded by LMCache 0.5.6 to
    # the big-endian int of the digest's first 8 bytes: computed with the engine's own cbor2 and pickle.
    assert expected_none_hash("sha256_cbor", "0") == "5625442194607170974"
    assert expected_none_hash("sha256", "0") == "1834058204627357124"
    with pytest.raises(ValueError, match="not one of"):
        expected_none_hash("builtin", "0")


@pytest.mark.parametrize("line", [
    "[2026-12-05 12:00:00] LMCache WARNING: No eviction candidates found in local cpu backend. Local cpu memory is "
    "under pressure. Waiting for 0.1 seconds before retrying. (local_cpu_backend.py:725)",
    "LMCache WARNING: Local cpu memory under pressure so choosing to store only  3 total chunks of KV cache.",
    "LMCache WARNING: No eviction candidates found. Disk space under pressure.",
])
def test_a_dram_pool_under_pressure_is_trouble(line):
    assert re.search(LMCACHE_TROUBLE, line)


def _health_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), type("H", (http.server.BaseHTTPRequestHandler,), {
        "do_GET": lambda self: (self.send_response(200), self.end_headers()), "log_message": lambda *a: None}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_health_collects_every_processs_none_hash_and_odirect_line(sandbox):
    expected = expected_none_hash("sha256_cbor", "0")
    arm_dir = arm_params(sandbox, "local_nvme", EXPECTED_NONE_HASH=expected, DRAM_GIB=1.0)
    assert sandbox.run("deploy.sh", "preflight", arm_dir).returncode == 0
    server = _health_server()
    try:
        folder = sandbox.root / "runs" / "r1" / "local_nvme"
        (folder / "port").write_text(f"{server.server_address[1]}\n")
        (folder / "server").mkdir(exist_ok=True)
        (folder / "server" / "stdout").write_text(
            f"(EngineCore_DP0 pid=41) [LMCache INFO] Initialized NONE_HASH={expected} from vLLM (>= PR#20511)\n"
            "(EngineCore_DP0 pid=41) LMCache INFO: Using O_DIRECT for disk I/O: True\n")
        (folder / "server" / "stderr").write_text(f"LMCache INFO: Initialized NONE_HASH={expected} from vLLM\n")
        result = sandbox.run("deploy.sh", "health", arm_dir, "10")
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stderr
    observed = json.loads(result.stdout.split("FXPILOT_LMCACHE_OBSERVED=")[1].splitlines()[0])
    assert observed["none_hash"] == {"expected": expected, "observed": [
        {"process": "EngineCore_DP0 pid=41", "value": expected}, {"process": "stderr:1", "value": expected}]}
    assert observed["odirect"] == [{"process": "EngineCore_DP0 pid=41", "value": True}]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["versions"]["none_hash"] == observed["none_hash"]
    assert manifest["versions"]["odirect_observed"] == observed["odirect"]


def test_a_process_with_another_none_hash_stops_the_deploy_with_both_values():
    from runners.deploy import _observed_at_health

    deployment = Deployment(run_id="r", arm="fx", node="n1", deploy_id="d", run_dir="/r", arm_dir="/r/a",
                            none_hash={"expected": "5625442194607170974", "observed": []})
    out = "FXPILOT_LMCACHE_OBSERVED=" + json.dumps({"none_hash": {"observed": [
        {"process": "Worker_TP0 pid=7", "value": "5625442194607170974"}, {"process": "Worker_TP1 pid=8", "value": "12"}]},
        "odirect": []})
    with pytest.raises(DeployError, match=r"hash is 12 in Worker_TP1 pid=7|hash is 12 in Worker_TP1 pid=8, not the "
                                          r"expected 5625442194607170974"):
        _observed_at_health(SimpleNamespace(name="n1"), deployment, out)


class _Conn:
    def __init__(self, manifest: dict):
        self.manifest = manifest

    def run(self, command, **kwargs):
        return SimpleNamespace(stdout=json.dumps(self.manifest), exit_code=0)


def test_a_fingerprint_other_than_the_plans_stops_the_deploy_with_both_values(settings):
    from runners.deploy import _read_manifest

    pinned = replace(settings, lmcache=replace(settings.lmcache, fingerprint="a" * 64))
    deployment = Deployment(run_id="r", arm="fx", node="n1", deploy_id="d", run_dir="/r", arm_dir="/r/a",
                            config_path="/r/a/lmcache.yaml")
    found = {"sha256": "b" * 64, "version": "0.5.6", "commit": "3e11e108", "disk_io_threads": 4}
    conn = _Conn({"disk_device": "nvme1n1", "versions": {"lmcache_fingerprint": found}})
    with pytest.raises(DeployError, match=f"fingerprint is {'b' * 64} .*not the plan's expected {'a' * 64}"):
        _read_manifest(SimpleNamespace(name="n1"), conn, pinned, deployment)
    deployment = Deployment(run_id="r", arm="fx", node="n1", deploy_id="d", run_dir="/r", arm_dir="/r/a",
                            config_path="/r/a/lmcache.yaml")
    _read_manifest(SimpleNamespace(name="n1"), conn, settings, deployment)  # no pin: recorded, not compared
    assert deployment.lmcache_fingerprint == found and deployment.disk_device == "nvme1n1"
    with pytest.raises(Exception, match="SHA-256"):
        validate_deployment(default_simulated() | {"lmcache": {"fingerprint": "xyz"}})


def test_lmcache_dram_above_the_nodes_available_memory_is_refused_with_both_values(sandbox):
    meminfo = sandbox.root / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemAvailable:    4194304 kB\n")
    sandbox.env["FXPILOT_MEMINFO"] = str(meminfo)
    result = sandbox.run("deploy.sh", "preflight", arm_params(sandbox, "dram", CACHE_DIR=None, DRAM_GIB=1.0))
    assert result.returncode != 0
    assert ("max_local_cpu_size is 1.0 GiB per rank: 8 ranks need 8.00 GiB (8589934592 B) of LMCache DRAM, above the "
            "4.00 GiB (4294967296 B) MemAvailable") in result.stderr
    ok = sandbox.run("deploy.sh", "preflight", arm_params(sandbox, "dram", CACHE_DIR=None, DRAM_GIB=0.5))
    assert ok.returncode == 0, ok.stderr


def test_an_lmcache_without_the_clear_api_is_refused_on_a_real_node(sandbox):
    # the simulated node's LMCache stand-in (0.3.15.dev12 metadata, no internal_api_server files) as a real node's
    result = sandbox.run("deploy.sh", "preflight", arm_params(sandbox, "fx", SIMULATED=False, DRAM_GIB=0.001,
                                                              LMCACHE_API_START=23000))
    assert result.returncode != 0
    assert "LMCache 0.3.15.dev12" in result.stderr and "serves no DELETE /cache/clear" in result.stderr
    assert "PR #1711" in result.stderr


def test_the_manifest_records_the_disk_device_and_the_fingerprint(sandbox):
    arm_dir = arm_params(sandbox, "fx", DRAM_GIB=0.001, LMCACHE_API_START=23100)
    result = sandbox.run("deploy.sh", "preflight", arm_dir)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((sandbox.root / "runs" / "r1" / "fx" / "manifest.json").read_text())
    assert manifest["disk_device"] == "nvme1n1"  # the device df names, as /proc/diskstats names it
    assert manifest["lmcache_api_port_start"] == 23100
    fingerprint = manifest["versions"]["lmcache_fingerprint"]
    assert re.match(r"^[0-9a-f]{64}$", fingerprint["sha256"]) and fingerprint["version"] == "0.3.15.dev12"
    assert fingerprint["files"] >= 2


def test_g1s_node_preflight_names_lmcache_dram_above_the_nodes_memory(sandbox, settings):
    from runners import preflight

    assert preflight.lmcache_dram_bytes(settings) == 8 * GIB  # 1 GiB per rank × TP 8
    assert f"--lmcache-dram-bytes {8 * GIB}" in preflight.command("~/p", "~/p/out", settings)
    meminfo = sandbox.root / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemAvailable:    4194304 kB\n")
    sandbox.env["FXPILOT_MEMINFO"] = str(meminfo)
    out = sandbox.root / "out"
    result = sandbox.run("preflight.sh", "--out", str(out), "--model", "a/b", "--fx-mount", str(sandbox.root / "mnt" / "fx"),
                         "--local-path", str(sandbox.root / "mnt" / "nvme0"), "--run-root", str(sandbox.root / "runs"),
                         "--lmcache-dram-bytes", str(8 * GIB))
    assert result.returncode == 0, result.stderr
    report = (out / "preflight.tsv").read_text()
    assert f"memory\tlmcache\tshort\t{8 * GIB} {4 * GIB}" in report
    blockers = preflight.evaluate("gpu07", report, {"gpus": {"count": 8}}, settings)["blockers"]
    [blocker] = [b for b in blockers if b["code"] == "dram_too_big"]
    assert blocker["message"] == ("deployment.sizes.max_local_cpu_size × tensor_parallel_size asks for 8.00 GiB "
                                  "(8589934592 B) of LMCache DRAM on gpu07, above its 4.00 GiB (4294967296 B) of "
                                  "available memory (MemAvailable): lower max_local_cpu_size or free the memory")
