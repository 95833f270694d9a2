"""The simulated node's block-device counters: a file in /proc/diskstats format (docs/contracts.md, interface 3).

The simulated node names it in every command's environment (FXPILOT_DISKSTATS); the simulated server adds what its
disk tiers read (and write) to the device that holds each tier, so the workload client's `--disk-device` samples see
LMCache's reads as on a real node. 512-byte sectors, fields as the kernel prints them (5.5 and later: 20 fields per
line, field 6 = sectors read, field 10 = sectors written). Every update is a read-modify-write under a lock file and
an atomic rename: two servers on one node never lose each other's counts and a reader never sees half a file.
Standard library only (the simulated node imports it too).
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

SECTOR = 512
FIELDS = 20                       # major minor name + 17 counters (kernel >= 5.5)
# (major, minor, name) of the simulated node's block devices: its boot disk, the local NVMe, the FX namespace
DEFAULT_DEVICES = ((8, 0, "sda"), (8, 2, "sda2"), (259, 0, "nvme0n1"), (259, 1, "nvme1n1"))


def format_line(major: int, minor: int, name: str, counters: list[int]) -> str:
    values = list(counters) + [0] * (FIELDS - 3 - len(counters))
    return f"{major:4d} {minor:7d} {name} " + " ".join(str(int(v)) for v in values[:FIELDS - 3])


def initial_text(devices=DEFAULT_DEVICES) -> str:
    """A node's counters at boot: a few reads of each device, as a running kernel shows."""
    lines = []
    for major, minor, name in devices:
        reads = 1000 + 17 * minor
        lines.append(format_line(major, minor, name, [reads, 12, reads * 8, reads // 4, 200, 3, 1600, 90, 0, 400,
                                                      380, 0, 0, 0, 0, 0, 0]))
    return "\n".join(lines) + "\n"


def ensure(path: Path | str, devices=DEFAULT_DEVICES) -> Path:
    """Create the file (with the node's devices) when it is not there; returns its path."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _replace(path, initial_text(devices))
    return path


def device_name(namespace: str | None) -> str | None:
    """/dev/nvme1n1 → nvme1n1, the name /proc/diskstats shows."""
    return os.path.basename(namespace.rstrip("/")) if namespace else None


def _replace(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def add(path: Path | str, device: str, *, read_bytes: int = 0, write_bytes: int = 0, read_ios: int = 0,
        write_ios: int = 0, read_ms: int = 0, write_ms: int = 0) -> None:
    """Add reads and writes to ``device``'s row (a row is added when the file has none for it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            text = path.read_text() if path.exists() else initial_text()
            lines = [line for line in text.splitlines() if line.strip()]
            index = next((i for i, line in enumerate(lines)
                          if len(line.split()) >= 14 and line.split()[2] == device), None)
            if index is None:
                lines.append(format_line(259, 100 + len(lines), device, []))
                index = len(lines) - 1
            parts = lines[index].split()
            counters = [int(value) for value in parts[3:]] + [0] * (FIELDS - len(parts))
            counters[0] += read_ios
            counters[2] += -(-int(read_bytes) // SECTOR)
            counters[3] += read_ms
            counters[4] += write_ios
            counters[6] += -(-int(write_bytes) // SECTOR)
            counters[7] += write_ms
            counters[10] += read_ms + write_ms
            lines[index] = format_line(int(parts[0]), int(parts[1]), device, counters)
            _replace(path, "\n".join(lines) + "\n")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def sectors_read(path: Path | str, device: str) -> int | None:
    """Field 6 of ``device``'s row (tests and tools); None when the file has no such row."""
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[2] == device:
            return int(parts[5])
    return None
