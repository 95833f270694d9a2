"""Whole demos as a new user runs them, shared by the tests of this folder.

Three demos start together the first time one is asked for, each with its own data folder, its own
embedded broker and an ephemeral portal port (`--port 0`), so they cannot collide with each other or
with a parallel run; each process they start carries a mark in its environment (FXPILOT_TEST_MARK),
by which the tests find what they started, and what is left behind. Their output is not a terminal:
the demo prints plain lines (a progress line at most every 10 s), and the tests wait for events (a line
the demo prints, a step of a run that the demo's database shows running), never for a count at a moment.

* `nominal`: the one whole pilot, G1 → G4 with the soak sized on this machine. A background thread kills
  its Celery worker with SIGKILL as soon as a workload step of G1 runs (the demo restarts it and the run
  completes), and, once the reports are written and the portal serves, kills the demo itself with
  SIGKILL (its children must stop on their own). Every test of the whole pilot reads this one demo.
* `degraded`: `--scenario degraded-fx --no-serve`: G3 fails and the pilot halts there, so it stops after G3.
* `hangup`: closing the terminal (SIGHUP) as soon as a workload step of G1 runs, at a small time scale: the
  demo cancels that run and stops everything; it ends within a minute of its start.
"""
from __future__ import annotations

import os
import re
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
WORKLOAD_STEPS = ("populate", "evict", "measure")
# what a demo runs once its cluster is up: the embedded broker, the simulated nodes, the worker, the portal
SERVICES = {"broker": "redis-server", "simulated nodes": "manage.py simnode", "worker": "celery",
            "portal": "gunicorn"}


class Demo:
    def __init__(self, folder: Path, *args: str):
        folder.mkdir(parents=True, exist_ok=True)
        self.data = folder / "var"
        self.mark = uuid.uuid4().hex
        self.out = folder / "demo.out"
        self.started = time.monotonic()
        self.ended: float | None = None
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "FXPILOT_ENV")}
        # the approver's own machine for the demo's countersignatures (reports.customer_sign_demo), beside the
        # data folder in this demo's session folder, never inherited from the environment
        env.update({"FXPILOT_DATA_DIR": str(self.data), "FXPILOT_TEST_MARK": self.mark,
                    "FXPILOT_DEMO_CUSTOMER_DIR": str(folder / "customer-side")})
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "demo", "--port", "0", *args], cwd=ROOT, env=env,
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def until(self, what: str, condition, timeout: float, every: float = 0.3):
        """Wait for `condition()` to give something true and return it; fail naming `what`, with the demo's output
        tail, if the demo exits first or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while True:
            found = condition()
            if found:
                return found
            if self.proc.poll() is not None:
                raise AssertionError(f"the demo exited ({self.proc.returncode}) before {what}:\n{self.text()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"hung: no {what} after {timeout:g} s:\n{self.text()[-4000:]}")
            time.sleep(every)

    def wait_for(self, text: str, timeout: float) -> None:
        self.until(repr(text), lambda: text in self.text(), timeout)

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match:
        return self.until(f"line matching {pattern!r}", lambda: re.search(pattern, self.text(), re.MULTILINE), timeout)

    def running_step(self, gate: int, names=WORKLOAD_STEPS) -> tuple | None:
        """(seq, name) of a step of the gate's run that the demo's database shows running, if one is."""
        marks = ",".join("?" * len(names))
        try:
            rows = self.query(f"SELECT s.seq, s.name FROM runners_step s JOIN runners_job j ON s.job_id = j.id "
                              f"JOIN gates_gate g ON j.gate_id = g.id WHERE g.number = {int(gate)} "
                              f"AND s.status = 'running' AND s.name IN ({marks})", names)
        except sqlite3.Error:
            return None  # no database or no tables yet
        return rows[0] if rows else None

    def wait_for_running_step(self, gate: int, timeout: float) -> tuple:
        return self.until(f"G{gate} workload step running", lambda: self.running_step(gate), timeout, every=0.2)

    def mine(self) -> list[int]:
        """Live processes this demo started: those carrying its mark, and its Redis broker, found by the socket in
        its data folder (redis-server writes its title over its environment, so the mark cannot be read there)."""
        pids = set(marked(self.mark))
        socket = f"unixsocket:{self.data / 'redis'}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if b"redis-server" in cmdline and socket in cmdline and state != "Z":
                pids.add(int(entry.name))
        return sorted(pids)

    def services(self) -> dict[str, list[int]]:
        """What the demo runs now: SERVICES name → pids."""
        found: dict[str, list[int]] = {}
        for pid in self.mine():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            for name, needle in SERVICES.items():
                if needle in cmdline:
                    found.setdefault(name, []).append(pid)
        return found

    def wait_for_services(self, timeout: float) -> dict[str, list[int]]:
        return self.until("broker, simulated nodes, worker and portal all running",
                          lambda: (lambda s: s if set(s) == set(SERVICES) else None)(self.services()), timeout)

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

    def left_behind(self, within: float = 600) -> list[str]:
        deadline = time.monotonic() + within
        while self.mine() and time.monotonic() < deadline:
            time.sleep(0.5)
        found = []
        for pid in self.mine():
            try:
                found.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
            except OSError:
                continue
        return found

    def kill_all(self) -> None:
        for pid in [self.proc.pid, *self.mine()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def query(self, sql: str, params=()) -> list[tuple]:
        path = self.data / "fxpilot.sqlite3"
        if not path.exists():  # not made yet: a connection would make an empty one
            raise sqlite3.OperationalError(f"no database yet at {path}")
        with sqlite3.connect(path, timeout=600) as db:
            return db.execute(sql, params).fetchall()


class Scenario(threading.Thread):
    """What a test does to a running demo, in the background while other tests wait for theirs; the steps
    it reached and the first failure are kept for the tests to report."""

    def __init__(self, demo: Demo, steps):
        super().__init__(daemon=True)
        self.demo, self.steps = demo, steps
        self.facts: dict = {}
        self.error: BaseException | None = None
        self.changed = threading.Condition()

    def run(self) -> None:
        try:
            self.steps(self.demo, self)
        except BaseException as error:  # noqa: BLE001 — handed to the tests that read the facts
            self.error = error
        with self.changed:
            self.changed.notify_all()

    def record(self, name: str, value) -> None:
        with self.changed:
            self.facts[name] = value
            self.changed.notify_all()

    def fact(self, name: str, timeout: float):
        """One fact, as soon as the scenario has it (the rest of the scenario may still be going)."""
        with self.changed:
            self.changed.wait_for(lambda: name in self.facts or not self.is_alive(), timeout)
        if name in self.facts:
            return self.facts[name]
        if self.error is not None:
            raise self.error
        raise AssertionError(f"hung: no {name!r} after {timeout:g} s:\n{self.demo.text()[-4000:]}")

    def result(self, timeout: float) -> dict:
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"hung: the scenario did not finish in {timeout:g} s:\n{self.demo.text()[-4000:]}")
        if self.error is not None:
            raise self.error
        return self.facts


def nominal_steps(demo: Demo, scenario: Scenario) -> None:
    scenario.record("g1_step_killed", demo.wait_for_running_step(1, 900))
    os.kill(demo.worker_pid(), signal.SIGKILL)
    scenario.record("worker_killed", True)
    demo.wait_for("the worker process stopped (exit -9); starting it again", 600)
    demo.wait_for("resumed what the worker held", 600)
    demo.wait_for("G1 run ended", 900)
    scenario.record("g1_ended", True)
    # the soak is sized on this machine; a machine that got much busier meanwhile may need a longer one
    demo.wait_for("The portal stays up until Ctrl-C.", 3600)
    scenario.record("portal", next(line.split()[1] for line in demo.text().splitlines() if line.startswith("Portal: ")))
    scenario.record("services", demo.wait_for_services(600))
    with urllib.request.urlopen(scenario.facts["portal"] + "accounts/login/", timeout=600) as answer:
        scenario.record("portal_status", answer.status)
    # Killed outright (no clean-up), after a worker restart: the kernel sends its children SIGTERM.
    os.kill(demo.proc.pid, signal.SIGKILL)
    demo.wait(600)
    scenario.record("left_behind", demo.left_behind(600))


def hangup_steps(demo: Demo, scenario: Scenario) -> None:
    scenario.record("g1_step", demo.wait_for_running_step(1, 900))
    scenario.record("services", demo.wait_for_services(600))
    os.kill(demo.proc.pid, signal.SIGHUP)
    scenario.record("exit", demo.wait(600))
    scenario.record("left_behind", demo.left_behind(600))


@pytest.fixture(scope="session")
def demos(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos")
    started = {"nominal": Demo(root / "nominal"),
               "degraded": Demo(root / "degraded", "--scenario", "degraded-fx", "--no-serve"),
               "hangup": Demo(root / "hangup", "--time-scale", "0.005")}
    scenarios = {"nominal": Scenario(started["nominal"], nominal_steps),
                 "hangup": Scenario(started["hangup"], hangup_steps)}
    for scenario in scenarios.values():
        scenario.start()
    yield started, scenarios
    for demo in started.values():
        demo.kill_all()
