"""The G1 preflight: every blocker of a node at once, over real SSH, before anything is deployed."""
from __future__ import annotations

import shutil
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.urls import reverse
from django.utils import translation

from runners import preflight
from runners.config import default_simulated, validate_deployment
from runners.inventory import TOOL_HINTS
from runners.models import Artifact, Node
from runners.probe import NodeNotReady, ProbeSettingsError, probe_node, vllm_launch
from tests.runners.conftest import job_text

SCRIPT = Path(__file__).resolve().parents[2] / "runners" / "remote" / "preflight.sh"
PROBE_TOOLS = ["amd-smi", "nvme", "fio", "ethtool", "ibv_devinfo", "rdma", "ip", "python3", "mount", "tar", "sha256sum"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_plain_linux_host_lists_every_missing_piece_in_one_run(sshd, make_node, job, tmp_path):
    """No GPU tools, no vLLM, no model, an FX target nobody answers for, a port in use: all named together."""
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        deployment = default_simulated() | {
            "ports": {"base": 0, "arms": {"recompute": port}},
            "paths": {"fx_mount": str(tmp_path / "fx"), "local_nvme_path": str(tmp_path / "nvme"),
                      "shared_pool": str(tmp_path / "fx" / "shared"), "run_root": str(tmp_path / "runs")},
            "fx_target": {"transport": "rdma", "address": "127.0.0.1", "service_id": _closed_port(),
                          "nqn": "nqn.2026-01.com.example.fx:fx100.pool0"}}
        job.pilot.deployment = deployment
        job.pilot.save(update_fields=["deployment"])
        node = make_node(sshd, name="node1")
        with pytest.raises(NodeNotReady) as caught:
            probe_node(node, job=job, fio_runtime=1)
    assert isinstance(caught.value, ProbeSettingsError)  # what the probe step turns into an `error`, never a verdict
    messages = [b["message"] for b in caught.value.blockers]
    expected = [f"`{tool}` is not installed on node1: {TOOL_HINTS[tool]}" for tool in PROBE_TOOLS if not shutil.which(tool)]
    assert "`amd-smi` is not installed on node1: install ROCm's amd-smi" in expected  # the host is a plain one
    for message in expected:
        assert message in messages
    codes = {b["code"] for b in caught.value.blockers}
    if not shutil.which("vllm"):
        assert "vllm_missing" in codes
    assert {"model_missing", "port_busy", "mount_absent"} <= codes  # the FX mount point is not there either
    if not shutil.which("nvme") and not any(Path("/sys/class/infiniband").glob("*")):
        assert any(m.startswith("the FX target 127.0.0.1:") and "no RDMA device on this node" in m for m in messages)
    assert f"port {port} on node1 is already in use: stop what listens there or choose other ports" in messages
    assert any(m.startswith("the model Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8 is not on node1") for m in messages)
    assert "gpus_too_few" not in codes  # with no GPU tool the GPUs cannot be counted: the tool is the blocker
    # one message lists them all, and nothing already collected is lost
    assert str(caught.value).startswith(f"node1 cannot run the gate ({len(messages)} blockers): ")
    stored = Node.objects.get(pk=node.pk).inventory
    assert stored["preflight"]["blockers"] == caught.value.blockers and stored["simulated"] is False
    assert Artifact.objects.filter(job=job, name="node1/probe/preflight.tsv").exists()
    assert "preflight: `amd-smi` is not installed on node1" in job_text(job)


def test_a_simulated_node_without_its_gpu_tools_and_vllm(simnodes, make_node, job):
    server = simnodes(1, missing_tools=["amd-smi", "rocm-smi", "vllm"])[0]
    node = make_node(server)
    with pytest.raises(NodeNotReady) as caught:
        probe_node(node, job=job, fio_runtime=1)
    assert [b["message"] for b in caught.value.blockers] == [
        "`amd-smi` is not installed on node1: install ROCm's amd-smi",
        "vLLM (`vllm`) is not found on node1: install it or set how it is launched"]
    inventory = Node.objects.get(pk=node.pk).inventory
    assert inventory["gpus"]["count"] == 0 and inventory["vllm"] is None
    assert "`amd-smi` is not installed on node1: install ROCm's amd-smi" in inventory["problems"]
    assert inventory["fio"]["fx"]["read_gbps"] > 0  # the rest of the probe still ran


def test_a_simulated_node_whose_sudo_asks_for_a_password_cannot_run_the_gate(simnodes, make_node, job):
    """G4 cuts the FX path with `sudo -n ip link set`: a sudo that wants a password blocks the node, simulated too."""
    server = simnodes(1, sudo_password=True)[0]
    with pytest.raises(NodeNotReady) as caught:
        probe_node(make_node(server), job=job, fio_runtime=1)
    assert [b["message"] for b in caught.value.blockers] == [
        "sudo asks the SSH user of node1 for a password (sudo: a password is required): allow password-less sudo "
        "for nvme, mount, mkfs.xfs and ip link set (G4 cuts the FX path with it)"]


def test_only_one_missing_gpu_tool_is_no_blocker(simnodes, make_node, job):
    server = simnodes(1, missing_tools=["amd-smi"])[0]
    inventory = probe_node(make_node(server), job=job, fio_runtime=1)  # rocm-smi counts the GPUs
    assert inventory["preflight"]["ok"] and inventory["gpus"]["count"] == 8


def _settings(**changes):
    return validate_deployment(default_simulated() | changes)


def test_findings_become_blockers_with_the_node_and_what_to_do():
    report = "\n".join([
        "sudo\tnopasswd\tdenied\tsudo: a password is required", "tool\tamd-smi\tok\t/usr/bin/amd-smi",
        "tool\trocm-smi\tmissing\t", "tool\tfio\tmissing\t", "vllm\tversion\tfailed\tImportError: libamdhip64.so",
        "model\tcache\tok\t/x", "port\t8000\tok\t", "port\t8001\tbusy\t",
        "fx\ttarget\tnot-offered\t10.0.0.5:4420", "mount\tfx_mount\tnotdir\t/mnt/fx",
        "mount\trun_root\tblocked\t/srv/runs (cannot be created under /srv)",
        "mount\tlocal_nvme_path\tabsent\t/mnt/nvme0/fxpilot"])
    result = preflight.evaluate("gpu07", report, {"gpus": {"count": 4}}, _settings())
    assert result["ok"] is False
    assert [b["message"] for b in result["blockers"]] == [
        "`fio` is not installed on gpu07: install fio",
        "sudo asks the SSH user of gpu07 for a password (sudo: a password is required): allow password-less sudo "
        "for nvme, mount, mkfs.xfs and ip link set (G4 cuts the FX path with it)",
        "`vllm --version` fails on gpu07: ImportError: libamdhip64.so",
        "port 8001 on gpu07 is already in use: stop what listens there or choose other ports",
        "the FX target 10.0.0.5:4420 does not offer nqn.2026-01.com.example.fx:fx100.pool0 to gpu07",
        "/mnt/fx (fx_mount) on gpu07 exists but is not a folder",
        "/srv/runs (run_root) cannot be created on gpu07",
        "gpu07 has 4 GPUs; the deployment needs 8 (tensor_parallel_size)"]
    assert preflight.evaluate("gpu07", "", {}, _settings())["blockers"][0]["code"] == "no_report"
    mixed = {"gpus": {"count": 8, "devices": [{"index": i, "model": "MI300X" if i < 4 else "MI308X"} for i in range(8)]}}
    assert [b["message"] for b in preflight.evaluate("gpu07", "tool\tamd-smi\tok\t", mixed, _settings())["blockers"]] == [
        "gpu07 mixes GPU models (MI300X, MI308X): one server's tensor-parallel GPUs must be alike"]


def test_a_page_cache_drop_the_client_cannot_do_blocks_the_node():
    """The client drops the page cache as the SSH user without sudo (issue 26): drop_page_cache asks preflight.sh to
    check that user can write drop_caches, and a denial is a blocker saying what to do."""
    settings = _settings(use_odirect=False, drop_page_cache=True)
    assert preflight.command("~/p", "~/p/out", settings).endswith(" --drop-page-cache")
    assert "--drop-page-cache" not in preflight.command("~/p", "~/p/out", _settings())
    report = "tool\tamd-smi\tok\t\npagecache\tdrop\tdenied\tgpu cannot write /proc/sys/vm/drop_caches"
    [blocker] = preflight.evaluate("gpu07", report, {"gpus": {"count": 8}}, settings)["blockers"]
    assert blocker["message"] == (
        "deployment.drop_page_cache is set, but the workload client drops the page cache as the SSH user of gpu07 "
        "without sudo, and gpu cannot write /proc/sys/vm/drop_caches: connect as root or use O_DIRECT (use_odirect) "
        "instead")
    with translation.override("zh-hans"):
        assert "gpu07" in preflight.blocker_text(blocker) and "清除页缓存" in preflight.blocker_text(blocker)


def test_preflight_sh_checks_the_page_cache_drop_as_the_ssh_user(tmp_path):
    """preflight.sh itself: a drop_caches the user cannot write (a stand-in made immutable) is a denied finding."""
    import subprocess

    stand_in = tmp_path / "drop_caches"
    stand_in.write_text("0\n")
    if subprocess.run(["chattr", "+i", str(stand_in)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available here")
    try:
        out = tmp_path / "out"
        env = {"PATH": "/usr/bin:/bin", "FXPILOT_DROP_CACHES": str(stand_in), "HOME": str(tmp_path)}
        args = ["bash", str(SCRIPT), "--out", str(out), "--model", "m/x", "--fx-mount", str(tmp_path),
                "--local-path", str(tmp_path), "--run-root", str(tmp_path), "--drop-page-cache"]
        subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
        rows = preflight.parse_report((out / "preflight.tsv").read_bytes())
        assert {"check": "pagecache", "subject": "drop", "status": "denied",
                "detail": f"{subprocess.run(['id', '-un'], capture_output=True, text=True).stdout.strip()} cannot "
                          f"write {stand_in}"} in rows
        subprocess.run(["chattr", "-i", str(stand_in)], check=True)
        subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
        rows = preflight.parse_report((out / "preflight.tsv").read_bytes())
        assert [r["status"] for r in rows if r["check"] == "pagecache"] == ["ok"]
    finally:
        subprocess.run(["chattr", "-i", str(stand_in)], check=False)


def test_blockers_read_in_chinese():
    blocker = preflight.evaluate("node1", "tool\tamd-smi\tmissing\t\ntool\trocm-smi\tmissing\t", {}, _settings())["blockers"][0]
    with translation.override("zh-hans"):
        text = preflight.blocker_text(blocker)
    assert "node1" in text and "amd-smi" in text and "未安装" in text
    with translation.override("en"):
        assert preflight.blocker_text(blocker) == blocker["message"]


def test_the_remote_command_quotes_every_value():
    settings = _settings(ports={"base": 8000}, model="~/models/qwen3")
    line = preflight.command("~/.fxpilot/probe/x", "~/.fxpilot/probe/x/out", settings, vllm=("conda", "run", "vllm"))
    assert '--model "$HOME"/models/qwen3' in line and "--port 8000 --port 8001 --port 8002" in line
    assert "--vllm conda --vllm run --vllm vllm" in line and "--fx-nqn nqn.2026-01.com.example.fx:fx100.pool0" in line


def test_the_install_hints_are_the_inventory_s():
    assert preflight._HINTS == TOOL_HINTS


@pytest.fixture
def world(demo):
    from tests.portal.conftest import build_world

    return build_world(demo)


def test_the_node_page_lists_the_blockers_in_the_reader_s_language(client, world):
    report = "tool\tamd-smi\tmissing\t\ntool\trocm-smi\tmissing\t\nvllm\tcommand\tmissing\tvllm\n"
    found = preflight.evaluate(world.node.name, report, {}, _settings())
    Node.objects.filter(pk=world.node.pk).update(inventory={
        "schema": "fxpilot.inventory/1", "simulated": False, "preflight": found,
        "gpus": {"count": 8, "model": "AMD Instinct MI308X", "devices": [
            {"index": i, "model": "MI308X", "bdf": f"0000:{i:02x}:00.0"} for i in range(8)]},
        "nics": [{"name": "ens1f0np0", "state": "up", "speed_gbps": 100, "rdma_device": "mlx5_0", "rdma_state": "ACTIVE"}]})
    client.force_login(world.carol)
    page = client.get(reverse("node", args=[world.node.code])).content.decode()
    assert "This node cannot run the gate: 2 blockers." in page
    assert f"`amd-smi` is not installed on {world.node.name}: install ROCm&#x27;s amd-smi" in page
    assert "7: MI308X 0000:07:00.0" in page and "RDMA mlx5_0 ACTIVE" in page
    with translation.override("en"):  # the request switches the thread's language; give it back afterwards
        page = client.get(reverse("node", args=[world.node.code]), HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "此节点无法运行关卡：2 个阻碍项。" in page and f"{world.node.name} 上未安装 `amd-smi`：请安装 ROCm 的 amd-smi" in page


@pytest.mark.parametrize("launcher, words", [
    (None, ("vllm",)), (SimpleNamespace(kind="", venv=None, conda=None, prefix=()), ("vllm",)),
    (SimpleNamespace(kind="venv", venv="~/venvs/vllm/", conda=None, prefix=()), ("~/venvs/vllm/bin/vllm",)),
    (SimpleNamespace(kind="conda", venv=None, conda="rocm-vllm", prefix=()),
     ("conda", "run", "--no-capture-output", "-n", "rocm-vllm", "vllm")),
    (SimpleNamespace(kind="prefix", venv=None, conda=None, prefix=("docker", "run", "--rm", "rocm/vllm:latest")),
     ("docker", "run", "--rm", "rocm/vllm:latest", "vllm"))])
def test_vllm_is_checked_the_way_the_deployment_launches_it(launcher, words):
    settings = _settings() if launcher is None else SimpleNamespace(launcher=launcher)
    assert vllm_launch(settings) == words
    if words[0].startswith("~/"):
        line = preflight.command("~/p", "~/p/out", _settings(), vllm=words)
        assert '--vllm "$HOME"/venvs/vllm/bin/vllm' in line
