"""Real servers for the workload client's tests: the zero-delay streaming server of benchmarks/client,
started as a process on a free loopback port, misbehaving on request (by model name)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "benchmarks" / "client" / "stream_server.py"
CLIENT = ROOT / "runners" / "remote" / "workload.py"


@pytest.fixture
def start_server() -> Iterator[Callable[..., str]]:
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        proc = subprocess.Popen([sys.executable, str(SERVER), "--port", "0", *args], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on "), line
        return line.removeprefix("listening on ")

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=600)


@pytest.fixture
def server_url(start_server: Callable[..., str]) -> str:
    return start_server()


def run_client(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The client as a node runs it: a separate python3 process, standard library only."""
    return subprocess.run([sys.executable, str(CLIENT), *args], capture_output=True, text=True, timeout=timeout)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summaries(records: Path) -> list[dict]:
    return read_jsonl(records.with_name(records.name.removesuffix(".jsonl") + ".summary.json"))
