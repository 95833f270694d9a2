"""A simulated node's sandbox without SSH: the remote scripts run locally with the simulated tools on PATH."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from runners.config import shell_env_file as _env_file
from runners.simnode.state import default_state, load_state, save_state, update_state

REPO = Path(__file__).resolve().parents[2]
REMOTE = REPO / "runners" / "remote"
SIMNODE = REPO / "runners" / "simnode"
NQN = "nqn.2026-01.com.example.fx:fx100.pool0"


class Sandbox(SimpleNamespace):
    def state(self) -> dict:
        return load_state(self.root)

    def change(self, fn) -> dict:
        return update_state(self.root, fn)

    def run(self, script: str, *args: str, extra_path: Path | None = None) -> subprocess.CompletedProcess:
        env = dict(self.env)
        if extra_path is not None:
            env["PATH"] = f"{extra_path}:{env['PATH']}"
        return subprocess.run(["bash", str(REMOTE / script), *args], env=env, capture_output=True, text=True, timeout=120)

    def write_env(self, name: str, values: dict) -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_env_file(values))
        return str(path)


@pytest.fixture
def sandbox(tmp_path) -> Sandbox:
    root = tmp_path / "node1"
    (root / "mnt" / "fx").mkdir(parents=True)
    (root / "mnt" / "nvme0").mkdir(parents=True)
    save_state(root, default_state(root, "node1", 0.001))
    env = {
        "HOME": str(root), "FXPILOT_SIM_ROOT": str(root), "FXPILOT_PYTHON": sys.executable,
        "PATH": f"{SIMNODE / 'bin'}:{os.environ['PATH']}",
        "PYTHONPATH": f"{REPO}:{SIMNODE / 'pylib'}", "LANG": "C.UTF-8",
    }
    return Sandbox(root=root, env=env)


@pytest.fixture
def fx_env(sandbox) -> str:
    return sandbox.write_env("fx.env", {
        "FX_ADDRESS": "192.168.100.10", "FX_SERVICE_ID": 4420, "FX_NQN": NQN, "FX_HOST_NQN": None, "FX_FSTYPE": "xfs",
        "FX_MOUNT": str(sandbox.root / "mnt" / "fx"), "MKFS_IF_EMPTY": False, "RUN_DIR": str(sandbox.root / "runs" / "r1"),
    })
