"""Whole demos as a new user runs them, shared by the tests of this folder.

Three demos start together the first time one is asked for, each with its own data folder, its own
embedded broker and an ephemeral portal port (`--port 0`), so they cannot collide with each other or
with a parallel run; each process they start carries a mark in its environment (FXPILOT_TEST_MARK),
by which the tests find what is left behind.

* `nominal`: the whole pilot. A background thread kills its Celery worker with SIGKILL in the middle of
  G1 (the demo restarts it and the run completes), and, once the reports are written and the portal
  serves, kills the demo itself with SIGKILL (its children must stop on their own).
* `degraded`: `--scenario degraded-fx --no-serve`: G3 fails and the pilot halts there.
* `hangup`: closing the terminal (SIGHUP) in the middle of G1, at a small time scale.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.broker.conftest import marked

ROOT = Path(__file__).resolve().parents[2]
MID_GATE = "G1: step 4/"


class Demo:
    def __init__(self, folder: Path, *args: str):
        folder.mkdir(parents=True, exist_ok=True)
        self.data = folder / "var"
        self.mark = uuid.uuid4().hex
        self.out = folder / "demo.out"
        self.started = time.monotonic()
        self.ended: float | None = None
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "FXPILOT_ENV")}
        env.update({"FXPILOT_DATA_DIR": str(self.data), "FXPILOT_TEST_MARK": self.mark})
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "demo", "--port", "0", *args], cwd=ROOT, env=env,
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.text():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"the demo exited ({self.proc.returncode}) before {text!r}:\n{self.text()[-4000:]}")
            time.sleep(0.3)
        raise AssertionError(f"no {text!r} within {timeout} s:\n{self.text()[-4000:]}")

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self.ended = self.ended or time.monotonic()
        return code

    def worker_pid(self) -> int:
        for pid in marked(self.mark):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if b"celery" in cmdline and b"worker" in cmdline and ppid == self.proc.pid:
                return pid
        raise AssertionError("no worker process found")

    def left_behind(self, within: float = 30) -> list[str]:
        deadline = time.monotonic() + within
        while marked(self.mark) and time.monotonic() < deadline:
            time.sleep(0.5)
        found = []
        for pid in marked(self.mark):
            try:
                found.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
            except OSError:
                continue
        return found

    def kill_all(self) -> None:
        for pid in [self.proc.pid, *marked(self.mark)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def query(self, sql: str) -> list[tuple]:
        with sqlite3.connect(self.data / "fxpilot.sqlite3") as db:
            return db.execute(sql).fetchall()


class Scenario(threading.Thread):
    """What a test does to a running demo, in the background while other tests wait for theirs; the steps
    it reached and the first failure are kept for the tests to report."""

    def __init__(self, demo: Demo, steps):
        super().__init__(daemon=True)
        self.demo, self.steps = demo, steps
        self.facts: dict = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.steps(self.demo, self.facts)
        except BaseException as error:  # noqa: BLE001 — handed to the tests that read the facts
            self.error = error

    def fact(self, name: str, timeout: float):
        """One fact, as soon as the scenario has it (the rest of the scenario may still be going)."""
        deadline = time.monotonic() + timeout
        while name not in self.facts and self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        if name in self.facts:
            return self.facts[name]
        if self.error is not None:
            raise self.error
        raise AssertionError(f"no {name!r} within {timeout} s:\n{self.demo.text()[-4000:]}")

    def result(self, timeout: float) -> dict:
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"the scenario did not finish within {timeout} s:\n{self.demo.text()[-4000:]}")
        if self.error is not None:
            raise self.error
        return self.facts


def nominal_steps(demo: Demo, facts: dict) -> None:
    demo.wait_for(MID_GATE, 600)
    os.kill(demo.worker_pid(), signal.SIGKILL)
    facts["worker_killed"] = True
    demo.wait_for("the worker process stopped (exit -9); starting it again", 60)
    demo.wait_for("resumed what the worker held", 60)
    demo.wait_for("G1 run ended", 900)
    facts["g1_ended"] = True
    demo.wait_for("The portal stays up until Ctrl-C.", 3600)  # a busy machine may need a longer G4 soak
    facts["portal"] = next(line.split()[1] for line in demo.text().splitlines() if line.startswith("Portal: "))
    facts["processes"] = len(marked(demo.mark))
    with urllib.request.urlopen(facts["portal"] + "accounts/login/", timeout=30) as answer:
        facts["portal_status"] = answer.status
    # Killed outright (no clean-up), after a worker restart: the kernel sends its children SIGTERM.
    os.kill(demo.proc.pid, signal.SIGKILL)
    demo.wait(10)
    facts["left_behind"] = demo.left_behind(30)


def hangup_steps(demo: Demo, facts: dict) -> None:
    demo.wait_for(MID_GATE, 600)
    facts["processes"] = len(marked(demo.mark))
    os.kill(demo.proc.pid, signal.SIGHUP)
    facts["exit"] = demo.wait(120)
    facts["left_behind"] = demo.left_behind(30)


@pytest.fixture(scope="session")
def demos(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos")
    started = {"nominal": Demo(root / "nominal"),
               "degraded": Demo(root / "degraded", "--scenario", "degraded-fx", "--no-serve"),
               "hangup": Demo(root / "hangup", "--time-scale", "0.01")}
    scenarios = {"nominal": Scenario(started["nominal"], nominal_steps),
                 "hangup": Scenario(started["hangup"], hangup_steps)}
    for scenario in scenarios.values():
        scenario.start()
    yield started, scenarios
    for demo in started.values():
        demo.kill_all()
