"""Real processes for the broker tests: a private Redis server (restartable), Celery workers of the
fxpilot app, producers in processes of their own, and a way to find every process a test started."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from infra import broker
from infra.lifetime import die_with_parent

ROOT = Path(__file__).resolve().parents[2]


class RedisServer:
    """redis-server on a Unix socket of its own, with an append-only file, as production runs it."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.sock = broker.embedded_socket(folder)
        self.url = broker.embedded_url(folder)
        self.proc: subprocess.Popen | None = None

    def start(self) -> RedisServer:
        # A death signal: Redis writes its title over its environment, where the session's watcher looks for its mark.
        self.proc = broker.start_child(self.folder, persistent=True, preexec_fn=die_with_parent())
        return self

    def stop(self) -> None:
        if self.proc is not None:
            broker.stop_child(self.proc)

    def restart(self, down_for: float = 1.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()

    def client(self):
        import redis

        return redis.Redis(unix_socket_path=str(self.sock))


@pytest.fixture
def redis_server():
    folder = Path(tempfile.mkdtemp(prefix="fxb-"))  # short: a socket path has a length limit
    server = RedisServer(folder).start()
    yield server
    server.stop()


def marked(mark: str) -> list[int]:
    """Pids of live processes whose environment carries FXPILOT_TEST_MARK=mark (everything a test started)."""
    found = []
    needle = f"FXPILOT_TEST_MARK={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


class Procs:
    """Processes of one test, all carrying one mark in their environment; killed at the end."""

    def __init__(self, tmp_path: Path, url: str):
        self.tmp = tmp_path
        self.mark = uuid.uuid4().hex
        self.out = tmp_path / "deliveries.txt"
        self.env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        self.env.update({"CELERY_BROKER_URL": url, "FXPILOT_DATA_DIR": str(tmp_path / "var"), "PYTHONPATH": str(ROOT),
                         "FXPILOT_TEST_MARK": self.mark, "FXPILOT_BROKER_TEST_OUT": str(self.out)})
        self.started: list[subprocess.Popen] = []

    def spawn(self, name: str, argv: list[str], **env) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, cwd=ROOT, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        proc.log = self.tmp / f"{name}.log"  # type: ignore[attr-defined]
        self.started.append(proc)
        return proc

    def worker(self, name: str, queue: str, concurrency: int = 2) -> subprocess.Popen:
        proc = self.spawn(name, [sys.executable, "-m", "celery", "-A", "fxpilot", "worker", "-Q", queue,
                                 "-c", str(concurrency), "-P", "prefork", "-n", f"{name}@%h", "-l", "INFO",
                                 "--without-gossip", "--without-mingle", "--include", "tests.broker.tasks"])
        wait_for_text(proc, " ready.", 600)
        return proc

    def producer(self, name: str, queue: str, keys: list[str], **options) -> subprocess.Popen:
        code = ("import json, sys, django; django.setup()\n"
                "from fxpilot.celery import app\n"
                "options = json.loads(sys.argv[2])\n"
                "for key in open(sys.argv[1]).read().split():\n"
                f"    app.send_task('tests.broker.record', args=(key,), queue={queue!r}, **options)\n")
        keys_file = self.tmp / f"{name}.keys"
        keys_file.write_text("\n".join(keys))
        return self.spawn(name, [sys.executable, "-c", code, str(keys_file), json.dumps(options)],
                          DJANGO_SETTINGS_MODULE="fxpilot.settings")

    def deliveries(self) -> Counter:
        return Counter(self.out.read_text().split()) if self.out.exists() else Counter()

    def wait_deliveries(self, expected: set[str], timeout: float) -> Counter:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = self.deliveries()
            if expected <= set(seen):
                return seen
            time.sleep(0.2)
        return self.deliveries()

    def stop(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(600)
        for pid in marked(self.mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_for_text(proc: subprocess.Popen, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in proc.log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[:6]} exited ({proc.returncode}):\n{proc.log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"hung: {proc.args[:6]} did not log {text!r} in {timeout:g} s:\n"
                         f"{proc.log.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def procs(tmp_path, redis_server):
    group = Procs(tmp_path, redis_server.url)
    yield group
    group.stop()
