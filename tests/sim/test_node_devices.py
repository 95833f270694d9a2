"""The simulated node names its block devices as findmnt, lsblk and nvme list do, and keeps /proc/diskstats-format
counters that every command finds through FXPILOT_DISKSTATS."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from runners.sim import diskstats
from runners.simnode.server import SimNodeServer
from tests.sim.conftest import REPO


def tool(node, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FXPILOT_SIM_ROOT": str(node.root), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "runners.simnode.tools", *args], capture_output=True, text=True,
                          env=env, cwd=REPO)


def tool_env(node: SimNodeServer, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runners.simnode.tools", *args], capture_output=True, text=True,
                          env={**os.environ, **node.environment()}, cwd=REPO)


def test_findmnt_target_answers_the_device_holding_each_cache_path(node):
    (node.nvme / "kv" / "run1").mkdir(parents=True)
    (node.fx / "fxpilot-shared").mkdir(parents=True)
    assert tool(node, "findmnt", "-no", "SOURCE", "--target", str(node.nvme / "kv" / "run1")).stdout == "/dev/nvme0n1\n"
    assert tool(node, "findmnt", "-no", "SOURCE", "--target", str(node.fx / "fxpilot-shared")).stdout == "/dev/nvme1n1\n"
    assert tool(node, "findmnt", "-no", "SOURCE", "--target", str(node.fx)).stdout == "/dev/nvme1n1\n"
    assert tool(node, "findmnt", "-n", "-o", "SOURCE", "-T", str(node.root)).stdout == "/dev/sda2\n"
    missing = tool(node, "findmnt", "-no", "SOURCE", "--target", str(node.fx / "nothing"))
    assert (missing.returncode, missing.stdout) == (1, "")


def test_lsblk_names_the_namespaces_and_a_partition_s_parent(node):
    assert tool(node, "lsblk", "-ndo", "KNAME", "/dev/nvme1n1").stdout == "nvme1n1\n"
    assert tool(node, "lsblk", "-no", "PKNAME", "/dev/sda2").stdout == "sda\n"
    assert tool(node, "lsblk", "-ndo", "PKNAME", "/dev/nvme0n1").stdout == "\n"
    assert tool(node, "lsblk", "-n", "/dev/nvme9n1").returncode == 32
    node.unmount_fx()
    assert tool(node, "lsblk", "-n", "/dev/nvme1n1").returncode == 32


def test_every_command_finds_the_node_s_diskstats_with_its_devices(tmp_path):
    keys = tmp_path / "authorized_keys"
    keys.write_text("")
    node = SimNodeServer(tmp_path / "node7", "node7", authorized_keys=keys)
    node.prepare()
    path = Path(node.environment()["FXPILOT_DISKSTATS"])
    names = [line.split()[2] for line in path.read_text().splitlines()]
    assert names == ["sda", "sda2", "nvme0n1", "nvme1n1"]
    assert all(len(line.split()) == 20 for line in path.read_text().splitlines())
    # and its memory where deploy.sh reads it (MemAvailable), the same the simulated `free` shows
    meminfo = Path(node.environment()["FXPILOT_MEMINFO"]).read_text()
    available = next(int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemAvailable:"))
    free = tool_env(node, "free", "-b").stdout.splitlines()[1].split()
    assert available * 1024 == int(free[6])


def test_concurrent_updates_lose_no_sector_and_readers_see_whole_files(tmp_path):
    path = diskstats.ensure(tmp_path / "diskstats")
    start = diskstats.sectors_read(path, "nvme1n1")

    def reader_never_sees_half(stop: threading.Event, bad: list) -> None:
        while not stop.is_set():
            text = path.read_text()
            if len(text.splitlines()) != 4 or not text.endswith("\n"):
                bad.append(text)

    stop, bad = threading.Event(), []
    reader = threading.Thread(target=reader_never_sees_half, args=(stop, bad))
    reader.start()
    writers = [threading.Thread(target=lambda: [diskstats.add(path, "nvme1n1", read_bytes=4096) for _ in range(50)])
               for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    stop.set()
    reader.join()
    assert diskstats.sectors_read(path, "nvme1n1") - start == 4 * 50 * 8
    assert bad == []
