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
from tests.runners.conftest import credential, make_node, pilot, site, user_key  # noqa: F401  (shared fixtures)

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
        return subprocess.run(["bash", str(REMOTE / script), *args], env=env, capture_output=True, text=True, timeout=600)

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


@pytest.fixture(scope="module")
def sim_servers(tmp_path_factory, user_key) -> list:  # noqa: F811  (fixture parameters)
    """Two simulated GPU nodes (runners.simnode SSH servers on loopback), shared by a module's tests."""
    from concurrent.futures import ThreadPoolExecutor

    from runners.simnode.server import SimNodeServer

    base = tmp_path_factory.mktemp("simnodes")
    (base / "authorized_keys").write_text(user_key.public)
    servers = [SimNodeServer(base / name, name, authorized_keys=base / "authorized_keys", time_scale=0.001,
                             fx_array=base / "fx-array").start()
               for name in ("node1", "node2")]
    try:
        yield servers
    finally:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda server: server.stop(), servers))


@pytest.fixture
def sim_nodes(pilot, site, make_node, sim_servers) -> SimpleNamespace:  # noqa: F811  (fixture parameters)
    """The two simulated nodes registered with accepted host keys, their state fresh, and a gate-run job."""
    import shutil

    from runners.models import Job

    for server in sim_servers:
        for leftover in ("fxpilot-runs", "mnt"):
            shutil.rmtree(server.root / leftover, ignore_errors=True)
        save_state(server.root, default_state(server.root, server.name, 0.001))
        server.prepare()
    nodes = [make_node(server) for server in sim_servers]
    job = Job.objects.create(pilot=pilot, site=site, params={"time_scale": 0.001})
    return SimpleNamespace(job=job, site=site, nodes=nodes, servers=sim_servers, pilot=pilot)
