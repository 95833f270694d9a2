"""attach_fx.sh on a simulated node's sandbox: connect over rdma, mount, check writable, detach what it attached."""
from __future__ import annotations

import json

from tests.deploy.conftest import NQN


def disconnected(state: dict) -> None:
    state["fx"]["connected"] = False
    state["fx"]["mounted_at"] = None


def attach_record(sandbox) -> dict:
    return json.loads((sandbox.root / "runs" / "r1" / "fx-attach.json").read_text())


def test_it_connects_mounts_and_detaches_what_it_attached(sandbox, fx_env):
    sandbox.change(disconnected)
    attached = sandbox.run("attach_fx.sh", "attach", fx_env, "fx-a")
    assert attached.returncode == 0, attached.stderr
    assert "FX attached" in attached.stdout and "over rdma" in attached.stdout
    state = sandbox.state()
    assert state["fx"]["connected"] and state["fx"]["mounted_at"] == str(sandbox.root / "mnt" / "fx")
    record = attach_record(sandbox)
    assert record["connected_by_run"] and record["mounted_by_run"] and record["namespace"] == "/dev/nvme1n1"

    detached = sandbox.run("attach_fx.sh", "detach", fx_env, "fx-a")
    assert detached.returncode == 0, detached.stderr
    state = sandbox.state()
    assert not state["fx"]["connected"] and not state["fx"]["mounted_at"]
    again = sandbox.run("attach_fx.sh", "detach", fx_env, "fx-a")
    assert again.returncode == 0 and "already detached" in again.stdout


def test_an_fx_array_attached_before_the_run_stays_attached(sandbox, fx_env):
    attached = sandbox.run("attach_fx.sh", "attach", fx_env, "fx-a")
    assert attached.returncode == 0, attached.stderr
    assert "already connected" in attached.stdout and "already mounted" in attached.stdout
    assert sandbox.run("attach_fx.sh", "detach", fx_env, "fx-a").returncode == 0
    state = sandbox.state()
    assert state["fx"]["connected"] and state["fx"]["mounted_at"]


def test_fx_stays_attached_while_another_instance_of_the_run_uses_it(sandbox, fx_env):
    sandbox.change(disconnected)
    assert sandbox.run("attach_fx.sh", "attach", fx_env, "fx-a").returncode == 0
    assert sandbox.run("attach_fx.sh", "attach", fx_env, "fx-b").returncode == 0
    first = sandbox.run("attach_fx.sh", "detach", fx_env, "fx-a")
    assert "1 other user" in first.stdout and sandbox.state()["fx"]["connected"]
    assert sandbox.run("attach_fx.sh", "detach", fx_env, "fx-b").returncode == 0
    assert not sandbox.state()["fx"]["connected"]


def test_an_unreachable_target_fails_with_the_reason(sandbox, fx_env):
    def down(state):
        disconnected(state)
        state["faults"]["fx_down"] = True
    sandbox.change(down)
    result = sandbox.run("attach_fx.sh", "attach", fx_env, "fx-a")
    assert result.returncode != 0
    assert "unreachable over rdma" in result.stderr and "192.168.100.10:4420" in result.stderr
    assert sandbox.run("attach_fx.sh", "detach", fx_env, "fx-a").returncode == 0


def test_a_missing_mount_point_fails_with_the_reason(sandbox, fx_env):
    sandbox.change(disconnected)
    (sandbox.root / "mnt" / "fx").rmdir()
    result = sandbox.run("attach_fx.sh", "attach", fx_env, "fx-a")
    assert result.returncode != 0
    assert "mount point" in result.stderr and "does not exist" in result.stderr
    assert not sandbox.state()["fx"]["connected"]


def test_a_namespace_not_reached_over_rdma_is_refused_and_disconnected_on_teardown(sandbox, fx_env, tmp_path):
    sandbox.change(disconnected)
    shim = tmp_path / "tcp-shim"
    shim.mkdir()
    # The simulated nvme, with the FX path reported as NVMe/TCP: what a wrongly cabled node shows.
    (shim / "nvme").write_text(f'#!/usr/bin/env bash\n"{sandbox.env["PATH"].split(":")[0]}/nvme" "$@" | '
                               "sed 's/\"Transport\": \"rdma\"/\"Transport\": \"tcp\"/'\n")
    (shim / "nvme").chmod(0o755)
    result = sandbox.run("attach_fx.sh", "attach", fx_env, "fx-a", extra_path=shim)
    assert result.returncode != 0
    assert "transport 'tcp', not rdma" in result.stderr
    assert sandbox.state()["fx"]["connected"]
    assert sandbox.run("attach_fx.sh", "detach", fx_env, "fx-a", extra_path=shim).returncode == 0
    assert not sandbox.state()["fx"]["connected"]


def test_an_empty_namespace_is_not_formatted_unless_asked(sandbox, fx_env):
    def empty(state):
        disconnected(state)
        state["fx"]["formatted"] = False
    sandbox.change(empty)
    refused = sandbox.run("attach_fx.sh", "attach", fx_env, "fx-a")
    assert refused.returncode != 0 and "holds no filesystem" in refused.stderr and "mkfs_if_empty" in refused.stderr
    assert sandbox.state()["fx"]["formatted"] is False
    assert sandbox.run("attach_fx.sh", "detach", fx_env, "fx-a").returncode == 0

    asked = sandbox.write_env("fx-mkfs.env", {**_env_values(fx_env), "MKFS_IF_EMPTY": True})
    made = sandbox.run("attach_fx.sh", "attach", asked, "fx-a")
    assert made.returncode == 0, made.stderr
    assert "creating xfs" in made.stdout
    assert sandbox.state()["fx"]["formatted"] is True
    assert attach_record(sandbox)["mkfs_by_run"] is True


def test_the_wrong_subsystem_is_named(sandbox, fx_env):
    sandbox.change(disconnected)
    other = sandbox.write_env("fx-other.env", {**_env_values(fx_env), "FX_NQN": NQN + "x"})
    result = sandbox.run("attach_fx.sh", "attach", other, "fx-a")
    assert result.returncode != 0 and "does not offer subsystem" in result.stderr


def _env_values(path: str) -> dict:
    import shlex

    values = {}
    for line in open(path).read().splitlines():
        key, _, value = line.partition("=")
        parsed = shlex.split(value)
        values[key] = parsed[0] if parsed else None
    return values


def test_another_disk_mounted_at_the_fx_mount_point_is_refused(sandbox, fx_env):
    # The local NVMe's mount point configured as the FX mount: a run there would measure the local disk.
    wrong = sandbox.write_env("fx-wrong.env", {**_env_values(fx_env), "FX_MOUNT": str(sandbox.root / "mnt" / "nvme0")})
    result = sandbox.run("attach_fx.sh", "attach", wrong, "fx-a")
    assert result.returncode != 0
    assert "holds /dev/nvme0n1, which is not a namespace of" in result.stderr
