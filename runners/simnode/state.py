"""State of one simulated node: ``$FXPILOT_SIM_ROOT/state.json`` (docs/contracts.md §5).

Written by the simulated tools and the ``simnode`` command, read by the simulated server (runners.sim).
Standard library only: the simulated tools import this module on the node side.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

FAULTS = {
    "fx_down": False, "fx_degraded": 1.0, "slow_disk": 1.0, "server_crash_after_requests": None,
    "drop_ssh_after_seconds": None, "slow_command_seconds": 0, "refuse_auth": False, "fx_missing": False,
    "corrupt_transfers": False,  # fxpilot addition: the SFTP server flips the first byte of each file
    "sudo_password": False,  # fxpilot addition: the simulated sudo asks for a password (sudo -n refuses)
    # fxpilot addition: simulated tools left off the node's PATH, e.g. ["amd-smi", "vllm"] (a tool the host has
    # itself, such as ip or mount, stays reachable there)
    "missing_tools": [],
    "metrics_missing": False,  # fxpilot addition: the simulated server answers 404 at /metrics
}


def default_state(root: Path | str, node: str, time_scale: float) -> dict:
    root = Path(root)
    return {
        "node": node, "time_scale": time_scale, "simulated": True,
        "fx": {"connected": True, "namespace": "/dev/nvme1n1", "mounted_at": str(root / "mnt" / "fx")},
        "local_nvme": {"namespace": "/dev/nvme0n1", "path": str(root / "mnt" / "nvme0")},
        "faults": dict(FAULTS),
    }


def state_path(root: Path | str) -> Path:
    return Path(root) / "state.json"


def load_state(root: Path | str) -> dict:
    state = json.loads(state_path(root).read_text())
    state.setdefault("faults", {})
    for name, value in FAULTS.items():
        state["faults"].setdefault(name, value)
    return state


def save_state(root: Path | str, state: dict) -> None:
    """Atomic: readers never see half a file."""
    path = state_path(root)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".state-")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(state, handle, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def update_state(root: Path | str, change) -> dict:
    """Load, apply ``change(state)``, save; returns the new state."""
    state = load_state(root)
    change(state)
    save_state(root, state)
    return state


def fx_visible(state: dict) -> bool:
    return not state["faults"].get("fx_missing")


def fx_mount(state: dict) -> str | None:
    """Where FX is mounted now (None when not connected, not presented, or not mounted)."""
    fx = state["fx"]
    if not fx_visible(state) or not fx.get("connected"):
        return None
    return fx.get("mounted_at") or None


def mounts(state: dict) -> list[dict]:
    """Mounts the simulated node shows: the root fs, the local NVMe, and FX when mounted."""
    rows = [{"device": "/dev/sda2", "path": "/", "fstype": "ext4", "options": "rw,relatime", "id": 21}]
    local = state.get("local_nvme", {})
    if local.get("path"):
        rows.append({"device": local["namespace"], "path": local["path"], "fstype": "xfs",
                     "options": "rw,noatime,attr2,inode64,logbufs=8,logbsize=32k,noquota", "id": 22})
    fx_path = fx_mount(state)
    if fx_path:
        # As the kernel's mount ID: a new one for every mount, so an unmount and mount again shows.
        rows.append({"device": state["fx"]["namespace"], "path": fx_path, "fstype": "xfs",
                     "options": "rw,noatime,attr2,inode64,logbufs=8,logbsize=32k,noquota",
                     "id": 100 + int(state["fx"].get("mounts", 1))})
    return rows


def storage_kind(path: Path | str, state: dict) -> str:
    """``fx``, ``local_nvme`` or ``other``: the device behind ``path`` by the longest mount prefix."""
    target = os.path.realpath(os.path.expanduser(str(path)))
    best, kind = -1, "other"
    candidates = [(fx_mount(state), "fx"), (state.get("local_nvme", {}).get("path"), "local_nvme")]
    for mount, name in candidates:
        if not mount:
            continue
        mount = os.path.realpath(mount)
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) > best:
            best, kind = len(mount), name
    return kind


def link_shared_fx(mount_point: Path | str, state: dict) -> None:
    """Make the FX mount point show the FX array every simulated node of a cluster shares (state fx.shared_dir):
    a file one node writes on its FX mount is there for the others, as on one array behind the fabric."""
    shared = state["fx"].get("shared_dir")
    target = Path(mount_point)
    if not shared:
        target.mkdir(parents=True, exist_ok=True)
        return
    Path(shared).mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        if os.path.realpath(target) == os.path.realpath(shared):
            return
        target.unlink()
    elif target.is_dir():
        if any(target.iterdir()):
            return  # files written before the array was shared stay where they are
        target.rmdir()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(shared, target_is_directory=True)


def unlink_shared_fx(mount_point: Path | str) -> None:
    """Unmounting leaves an empty mount point, as on a real node."""
    target = Path(mount_point)
    if target.is_symlink():
        target.unlink()
        target.mkdir(parents=True, exist_ok=True)
