"""Real servers for the workload client's tests: the zero-delay streaming server of benchmarks/client,
started as a process on a free loopback port, misbehaving on request (by model name)."""
from __future__ import annotations

import json
import os
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


def run_client(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """The client as a node runs it: a separate python3 process, standard library only. `env`: variables added to
    this process's environment (e.g. FXPILOT_DISKSTATS)."""
    full = None if env is None else {**os.environ, **env}
    return subprocess.run([sys.executable, str(CLIENT), *args], capture_output=True, text=True, timeout=timeout,
                          env=full)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summaries(records: Path) -> list[dict]:
    return read_jsonl(records.with_name(records.name.removesuffix(".jsonl") + ".summary.json"))


class FakeLMCacheAPI:
    """LMCache's internal API server as far as the client uses it: `DELETE /cache/clear?locations=…` answers
    `status` with LMCache 0.5.6's body; every request is kept (method, path with query)."""

    def __init__(self, status: int = 200):
        import http.server
        import threading

        self.status, self.calls = status, []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_DELETE(self) -> None:  # noqa: N802 (http.server's naming)
                api.calls.append(("DELETE", self.path))
                ok = 200 <= api.status < 300
                body = json.dumps({"status": "success", "num_removed": 3} if ok else
                                  {"error": "Failed to clear cache", "message": "engine gone"}).encode()
                self.send_response(api.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def lmcache_api() -> Iterator[Callable[..., FakeLMCacheAPI]]:
    apis: list[FakeLMCacheAPI] = []

    def start(status: int = 200) -> FakeLMCacheAPI:
        apis.append(FakeLMCacheAPI(status))
        return apis[-1]

    yield start
    for api in apis:
        api.close()
