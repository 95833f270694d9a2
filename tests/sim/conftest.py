"""Real simulated servers (subprocesses on loopback ports) over a throw-away simulated node."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from runners.remote.workload import parse_metrics
from runners.sim.launch import free_port, stop
from runners.simnode.state import default_state, save_state, update_state

MODEL = "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8"
TRANSFER = '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
REPO = Path(__file__).resolve().parents[2]


def cached(usage: dict) -> int:
    """Cached prompt tokens of a usage as vLLM 0.20.1 reports them: no prompt_tokens_details at all on a miss."""
    details = usage.get("prompt_tokens_details")
    assert details is None or details["cached_tokens"] > 0, f"0.20.1 sends no details for a miss: {usage}"
    return details["cached_tokens"] if details else 0


def prompt_ids(length: int, seed: int = 1) -> list[int]:
    return [1000 + (i * 7919 + seed * 104729) % 30000 for i in range(length)]


class SimNode:
    def __init__(self, root: Path, scale: float):
        self.root = root
        state = default_state(root, "node1", scale)
        self.fx = Path(state["fx"]["mounted_at"])
        self.nvme = Path(state["local_nvme"]["path"])
        self.fx.mkdir(parents=True)
        self.nvme.mkdir(parents=True)
        save_state(root, state)

    def set_faults(self, **faults) -> None:
        update_state(self.root, lambda state: state["faults"].update(faults))

    def unmount_fx(self) -> None:
        update_state(self.root, lambda state: state["fx"].update(connected=False))


class SimServer:
    """One `python -m runners.sim serve` process; ``arm`` picks the LMCache layout."""

    def __init__(self, node: SimNode, arm: str = "fx", *, lmcache: dict | None = None, args: tuple = (),
                 env: dict | None = None, dev_mode: bool = True, name: str = "server"):
        self.node, self.arm, self.port = node, arm, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = node.root / f"{name}-{self.port}.log"
        self.env = {**os.environ, "FXPILOT_SIM_ROOT": str(node.root), **(env or {})}
        self.env.pop("FXPILOT_SIM_TIME_SCALE", None)
        if dev_mode:
            self.env["VLLM_SERVER_DEV_MODE"] = "1"
        self.argv = [sys.executable, "-m", "runners.sim", "serve", MODEL, "--tensor-parallel-size", "8",
                     "--host", "127.0.0.1", "--port", str(self.port), "--enable-prompt-tokens-details", *args]
        if arm == "recompute":
            self.argv.append("--no-enable-prefix-caching")
        else:
            config = lmcache if lmcache is not None else {
                "chunk_size": 256, "local_cpu": False, "max_local_disk_size": 50,
                "local_disk": f"file://{(node.fx if arm == 'fx' else node.nvme) / 'lmcache'}"}
            path = node.root / f"lmcache-{name}-{self.port}.yaml"
            path.write_text(yaml.safe_dump(config))
            self.env["LMCACHE_CONFIG_FILE"] = str(path)
            self.argv += ["--kv-transfer-config", TRANSFER]
        self.process: subprocess.Popen | None = None

    def start(self, wait: bool = True) -> SimServer:
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO)
        if wait:
            self.wait_healthy()
        return self

    def wait_healthy(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited {self.process.returncode}:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"server never became healthy:\n{self.log_text()}")

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
            self.log.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metrics(self) -> dict:
        with urllib.request.urlopen(self.url + "/metrics", timeout=600) as response:
            return parse_metrics(response.read().decode())

    def post(self, path: str, body: dict | None = None, timeout: float = 600) -> tuple[int, dict, bytes]:
        data = json.dumps(body or {}).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def complete(self, prompt, max_tokens: int = 4, **extra) -> dict:
        """A streamed completion; returns usage, token ids and the chunks."""
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "return_token_ids": True, **extra}
        status, headers, raw = self.post("/v1/completions", body)
        assert status == 200, raw
        events = [json.loads(line[6:]) for line in raw.decode().split("\n\n")
                  if line.startswith("data: ") and line != "data: [DONE]"]
        ids = [t for e in events for c in e["choices"] for t in c.get("token_ids", [])]
        usage = next(e["usage"] for e in events if e.get("usage"))
        return {"usage": usage, "ids": ids, "events": events, "headers": headers}

    def reset(self) -> None:
        status, _, _ = self.post("/reset_prefix_cache")
        assert status == 200


@pytest.fixture
def node(tmp_path) -> SimNode:
    return SimNode(tmp_path / "node1", scale=0.0005)


@pytest.fixture
def servers():
    started: list[SimServer] = []

    def start(*args, **kwargs) -> SimServer:
        server = SimServer(*args, **kwargs)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


def delta(before: dict, after: dict, name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)
