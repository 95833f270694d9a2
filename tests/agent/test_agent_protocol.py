"""The agent process against a scripted control plane (the standard library's HTTP server) and a real sshd.

What the live control plane cannot easily be made to do on cue: answer 503 to a result, be down when the agent
starts, ask to cancel, answer 410, refuse the token. The agent is the real process (`python -m runners.agent`,
its three variables only); the calls it gets follow docs/site-agent.md ("The protocol").
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from infra.lifetime import die_with_parent
from runners import sealing
from runners.agent.nodes import key_text
from tests.runners.conftest import sshd, user_key  # noqa: F401 — the real sshd and its authorised key

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "fxa_" + "x" * 40


class FakeControlPlane:
    """Records every request; ``script`` decides answers. Calls are made once the agent's key is known."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.public_key: str | None = None
        self.queue: list = []  # callables public_key -> call dict
        self.lock = threading.Lock()
        self.answers: dict[str, list] = {}  # path -> [(status, body), ...] used first, then the default
        self.payloads: dict[int, bytes] = {}
        self.refused: set[int] = set()  # indexes of the requests answered with an error
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _answer(self, status: int, body) -> None:
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream" if isinstance(body, bytes)
                                 else "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                path = self.path.removeprefix("/cp/agent/v1")
                with fake.lock:
                    fake.requests.append((self.command, path, dict(self.headers), raw))
                    scripted = fake.answers.get(path)
                    answer = scripted.pop(0) if scripted else None
                    if answer is not None and answer[0] >= 300:
                        fake.refused.add(len(fake.requests) - 1)
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._answer(401, {"error": "unknown token"})
                if answer is not None:
                    return self._answer(*answer)
                if path == "/hello":
                    fake.public_key = json.loads(raw)["public_key"]
                    return self._answer(200, {"site": "Scripted site", "site_code": "0000", "resealed": 0})
                if path == "/work":
                    with fake.lock:
                        calls = [make(fake.public_key) for make in fake.queue]
                        fake.queue.clear()
                    if not calls:
                        time.sleep(min(json.loads(raw).get("wait", 0), 1.0))
                    return self._answer(200, {"calls": calls})
                if path.endswith("/payload"):
                    return self._answer(200, fake.payloads[int(path.split("/")[2])])
                if path.endswith("/file"):
                    return self._answer(200, {"sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)})
                if path.endswith("/output"):
                    return self._answer(200, {"cancel": False})
                return self._answer(200, {"ok": True})

            do_GET = do_POST = do_PUT = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def seen(self, method: str, path: str) -> list[tuple[dict, bytes]]:
        with self.lock:
            return [(h, raw) for m, p, h, raw in self.requests if m == method and p == path]

    def wait_for(self, method: str, path: str, count: int = 1, timeout: float = 600) -> list[tuple[dict, bytes]]:
        deadline = time.monotonic() + timeout
        while len(self.seen(method, path)) < count:
            assert time.monotonic() < deadline, (f"hung: no {count}× {method} {path} in {timeout:g} s; "
                                                 f"seen {[r[:2] for r in self.requests]}")
            time.sleep(0.05)
        return self.seen(method, path)

    def done(self, call_id: int, count: int = 1, timeout: float = 600) -> dict:
        return json.loads(self.wait_for("POST", f"/calls/{call_id}/done", count, timeout)[-1][1])

    def output(self, call_id: int) -> dict[str, bytes]:
        """What the control plane took (answered 200) of a call's output."""
        out = {"stdout": b"", "stderr": b""}
        with self.lock:
            taken = [raw for i, (m, p, _h, raw) in enumerate(self.requests)
                     if m == "POST" and p == f"/calls/{call_id}/output" and i not in self.refused]
        for raw in taken:
            body = json.loads(raw) if raw else {}
            for stream in out:
                out[stream] += base64.b64decode(body.get(stream, ""))
        return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def cp():
    plane = FakeControlPlane()
    yield plane
    plane.close()


@pytest.fixture
def node(sshd, user_key):  # noqa: F811
    def spec(public_key: str, **fields) -> dict:
        data = {"name": "sshd", "host": "127.0.0.1", "port": sshd.port, "username": sshd.username,
                "host_key": key_text(sshd.host_key), "sealed_key": sealing.seal(public_key, user_key.text.encode()),
                "sealed_passphrase": "", "jump": None}
        data.update(fields)
        return data

    return spec


def call(node, call_id: int, op: str, args: dict, **node_fields):
    return lambda public_key: {"id": call_id, "op": op, "node": node(public_key, **node_fields), "args": args,
                               "deadline": time.time() + 600}


class Agent:
    def __init__(self, port: int, state: Path, log: Path) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
               "FXPILOT_AGENT_URL": f"http://127.0.0.1:{port}/cp", "FXPILOT_AGENT_TOKEN": TOKEN,
               "FXPILOT_AGENT_STATE": str(state), "FXPILOT_AGENT_SLOTS": "4"}
        self.log_path = log
        handle = open(log, "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "runners.agent"], cwd=ROOT, env=env, stdout=handle,
                                     stderr=subprocess.STDOUT, preexec_fn=die_with_parent())
        handle.close()

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=600)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture
def start_agent(tmp_path):
    started: list[Agent] = []

    def start(port: int) -> Agent:
        agent = Agent(port, tmp_path / "state", tmp_path / "agent.log")
        started.append(agent)
        return agent

    yield start
    for agent in started:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
        assert TOKEN not in agent.log()


def test_output_and_results_are_posted_again_until_the_control_plane_takes_them(cp, node, start_agent):
    cp.answers["/calls/1/output"] = [(503, {"error": "restarting"})]
    cp.answers["/calls/1/done"] = [(503, {"error": "restarting"}), (502, b"bad gateway")]
    agent = start_agent(cp.port)
    cp.wait_for("POST", "/hello")
    cp.queue.append(call(node, 1, "run", {"command": "echo one; sleep 1; echo two >&2; exit 3", "timeout": 60}))
    assert cp.done(1, count=3, timeout=600) == {"exit_code": 3}
    assert [json.loads(raw) for _h, raw in cp.seen("POST", "/calls/1/done")] == [{"exit_code": 3}] * 3
    assert cp.output(1) == {"stdout": b"one\n", "stderr": b"two\n"}
    # The output came before the result, all of it, once.
    order = [p for m, p, _h, _r in cp.requests if p.startswith("/calls/1/")]
    assert order.index("/calls/1/done") > max(i for i, p in enumerate(order) if p == "/calls/1/output")
    assert agent.stop() == 0
    assert "cannot be reached" in agent.log() and "answers again" in agent.log()


def test_the_agent_waits_for_a_control_plane_that_is_not_up_yet(node, start_agent):
    port = _free_port()
    agent = start_agent(port)
    time.sleep(3)
    assert agent.proc.poll() is None
    plane = FakeControlPlane(port)
    try:
        plane.wait_for("POST", "/hello", timeout=600)
        plane.queue.append(call(node, 5, "contact", {}))
        assert plane.done(5) == {}
        assert agent.stop() == 0
    finally:
        plane.close()
    log = agent.log()
    assert log.count("cannot be reached") == 1  # said once, not at every try
    assert "serving site Scripted site" in log


def test_a_cancel_or_a_410_stops_the_command(cp, node, start_agent):
    cp.answers["/calls/2/output"] = [(200, {"cancel": True})]
    cp.answers["/calls/3/output"] = [(410, {"error": "call 3 expired; stop it"})]
    cp.answers["/calls/3/done"] = [(410, {"error": "call 3 expired; stop it"})]
    agent = start_agent(cp.port)
    cp.wait_for("POST", "/hello")
    started = time.monotonic()
    cp.queue.append(call(node, 2, "run", {"command": "echo go; sleep 900", "timeout": 3600}))
    cp.queue.append(call(node, 3, "run", {"command": "echo go; sleep 900", "timeout": 3600}))
    assert cp.done(2)["error"]["kind"] == "connection-lost"
    cp.wait_for("POST", "/calls/3/done")
    # stopped, not ended by the sleeps: a bound only commands left running reach, however loaded the machine
    assert time.monotonic() - started < 600, "the cancel and the 410 did not stop `sleep 900`"
    assert agent.stop() == 0
    assert "asks to stop the command" in agent.log()
    assert "no longer waits" in agent.log()


def test_keep_alives_while_a_command_is_silent(cp, node, start_agent):
    agent = start_agent(cp.port)
    cp.wait_for("POST", "/hello")
    cp.queue.append(call(node, 4, "run", {"command": "sleep 11", "timeout": 60}))
    cp.done(4, timeout=600)
    keepalives = [raw for _h, raw in cp.seen("POST", "/calls/4/output") if json.loads(raw) == {}]
    assert len(keepalives) >= 2
    assert agent.stop() == 0


def test_put_and_get_through_the_protocol_and_the_host_key_errors(cp, node, start_agent, tmp_path, sshd):  # noqa: F811
    data = os.urandom(1_500_000)
    target = tmp_path / "node-files" / "put.bin"
    target.parent.mkdir()
    cp.payloads[10] = data
    agent = start_agent(cp.port)
    cp.wait_for("POST", "/hello")
    digest = hashlib.sha256(data).hexdigest()
    cp.queue.append(call(node, 10, "put", {"path": str(target), "mode": 0o600, "size": len(data), "sha256": digest}))
    assert cp.done(10) == {"sha256": digest}
    assert target.read_bytes() == data
    cp.queue.append(call(node, 11, "get", {"path": str(target)}))
    assert cp.done(11) == {}
    [(headers, body)] = cp.seen("PUT", "/calls/11/file")
    assert body == data and int(headers["Content-Length"]) == len(data)
    cp.payloads[12] = b"not what was meant"
    cp.queue.append(call(node, 12, "put", {"path": str(target) + "2", "mode": None, "size": 18, "sha256": digest}))
    assert cp.done(12)["error"]["kind"] == "io"
    assert not Path(str(target) + "2").exists() and not Path(str(target) + "2.part").exists()
    cp.queue.append(call(node, 13, "contact", {}, host_key=None))
    error = cp.done(13)["error"]
    assert error["kind"] == "host-key-pending" and error["offered_key"] == key_text(sshd.host_key)
    cp.queue.append(call(node, 14, "get", {"path": str(tmp_path / "absent")}))
    assert cp.done(14)["error"]["kind"] == "io"
    assert agent.stop() == 0


def test_a_refused_token_stops_the_agent_with_a_message(cp, start_agent):
    cp.answers["/work"] = [(401, {"error": "the agent token was revoked"})]
    agent = start_agent(cp.port)
    assert agent.proc.wait(timeout=600) == 1
    assert "refuses this agent's token" in agent.log() and "revoked" in agent.log()


def test_sigterm_lets_a_running_call_finish_and_a_second_one_leaves_at_once(cp, node, start_agent):
    agent = start_agent(cp.port)
    cp.wait_for("POST", "/hello")
    cp.queue.append(call(node, 20, "run", {"command": "sleep 2; echo finished", "timeout": 600}))
    cp.wait_for("POST", "/calls/20/output")  # running (a first keep-alive or output)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=600) == 0
    assert cp.done(20, timeout=600) == {"exit_code": 0} and cp.output(20)["stdout"] == b"finished\n"
    assert "SIGTERM: taking no new work" in agent.log()

    again = start_agent(cp.port)
    cp.wait_for("POST", "/hello", count=2)
    cp.queue.append(call(node, 21, "run", {"command": "sleep 900", "timeout": 3600}))
    cp.wait_for("POST", "/calls/21/output")
    again.proc.send_signal(signal.SIGTERM)
    time.sleep(1)
    assert again.proc.poll() is None  # waiting for the call
    started = time.monotonic()
    again.proc.send_signal(signal.SIGTERM)
    assert again.proc.wait(timeout=600) == 0
    assert time.monotonic() - started < 600, "the second SIGTERM waited for `sleep 900`"
    assert "leaving now" in again.log()
