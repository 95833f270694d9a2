"""The simulated node's tools print what the real ones print: the parsers read them as they read the real outputs."""
from __future__ import annotations

import json
import subprocess

import pytest

from runners import inventory as inv
from runners.simnode.server import SimNodeServer
from runners.simnode.state import update_state


@pytest.fixture
def sandbox(tmp_path, user_key):
    (tmp_path / "keys").write_text(user_key.public)
    server = SimNodeServer(tmp_path / "node1", "node1", authorized_keys=tmp_path / "keys", time_scale=0.0001)
    server.prepare()

    def run(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], cwd=server.root, env=server.environment(), capture_output=True,
                              text=True, timeout=600)

    run.server = server
    return run


def test_fio_runs_several_jobs_and_only_the_sequential_read_counts(sandbox):
    out = sandbox("fio --output-format=json --direct=1 --size=1g --bs=1M --ioengine=libaio "
                  "--name=seq --filename=mnt/fx/a.fio --rw=read --numjobs=2 "
                  "--name=rand --filename=mnt/fx/b.fio --rw=randread --stonewall")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [(j["jobname"], j["groupid"], j["job options"].get("rw")) for j in report["jobs"]] == [
        ("seq", 0, "read"), ("seq", 0, "read"), ("rand", 1, "randread")]
    result = inv.parse_fio(out.stdout, "fio-fx.json")
    assert result["job"] == "seq" and result["jobs"] == 2 and result["groupid"] == 0
    assert result["read_gbps"] == pytest.approx(sum(j["read"]["bw_bytes"] for j in report["jobs"][:2]) / 1e9, abs=1e-3)
    grouped = sandbox("fio --output-format=json --name=seq --filename=mnt/fx/a.fio --rw=read --numjobs=4 "
                      "--size=1g --group_reporting")
    assert len(json.loads(grouped.stdout)["jobs"]) == 1
    assert inv.parse_fio(grouped.stdout, "fio-fx.json")["read_gbps"] == pytest.approx(result["read_gbps"], rel=0.01)


def test_nvme_list_is_the_nested_shape_of_nvme_cli_2_11(sandbox):
    out = sandbox("nvme list -o json")
    data = json.loads(out.stdout)
    assert set(data["Devices"][0]) == {"HostNQN", "HostID", "Subsystems"}
    namespaces = inv.parse_nvme_list(out.stdout)
    assert [(n["namespace"], n["transport"]) for n in namespaces] == [("/dev/nvme0n1", "pcie"), ("/dev/nvme1n1", "rdma")]
    fx = namespaces[1]
    assert fx["nqn"] == "nqn.2026-01.com.example.fx:fx100.pool0" and fx["address"] == "192.168.100.10"


def test_amd_smi_prints_the_shapes_of_amd_smi_26(sandbox):
    static = json.loads(sandbox("amd-smi static --json").stdout)
    assert list(static) == ["gpu_data"] and len(static["gpu_data"]) == 8
    listed = json.loads(sandbox("amd-smi list --json").stdout)
    assert isinstance(listed, list) and {"gpu", "bdf", "uuid", "kfd_id"} <= set(listed[0])
    assert len(inv.parse_amd_smi_list(json.dumps(listed))) == 8


def test_the_nodes_python3_is_the_interpreter_itself_not_a_version_managers_shim(sandbox):
    import os
    import sys

    found = sandbox('command -v python3; python3 -c "import sys; print(sys.base_prefix)"').stdout.split()
    assert os.path.realpath(found[0]) == os.path.realpath(os.path.join(sys.base_prefix, "bin", "python3"))
    assert found[1] == sys.base_prefix
    assert sandbox("command -v fio").stdout.startswith(str(sandbox.server.environment()["PATH"].split(":")[0]))


def test_missing_tools_leave_the_path(sandbox):
    assert sandbox("command -v amd-smi && command -v vllm").returncode == 0
    update_state(sandbox.server.root, lambda state: state["faults"].update(missing_tools=["amd-smi", "vllm"]))
    assert sandbox("command -v amd-smi").returncode == 1 and sandbox("command -v vllm").returncode == 1
    missing = sandbox("amd-smi version")
    assert missing.returncode == 127 and "command not found" in missing.stderr
    assert sandbox("command -v nvme && command -v rocm-smi").returncode == 0


def test_the_simulated_model_is_in_the_simulated_node_s_cache(sandbox):
    from runners.config import DEFAULT_SIMULATED
    from runners.simnode.server import SIMULATED_MODEL_CACHE

    assert SIMULATED_MODEL_CACHE == "models--" + DEFAULT_SIMULATED["model"].replace("/", "--")
    snapshot = sandbox.server.root / ".cache" / "huggingface" / "hub" / SIMULATED_MODEL_CACHE / "snapshots" / "simulated"
    assert "Simulated - not evidence" in (snapshot / "config.json").read_text()
