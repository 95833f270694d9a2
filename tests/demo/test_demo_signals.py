"""The demo's process edges, with real processes: a worker killed with SIGKILL mid-gate is restarted and
the run completes (every record once), and a demo killed outright leaves nothing behind; closing the
terminal (SIGHUP) mid-gate cancels the run and stops everything the demo started. Each runs part of a
demo (G1), not a whole pilot."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.broker.conftest import marked

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow]


class Demo:
    def __init__(self, tmp_path: Path):
        self.data = tmp_path / "var"
        self.mark = uuid.uuid4().hex
        self.out = tmp_path / "demo.out"
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "FXPILOT_ENV")}
        env.update({"FXPILOT_DATA_DIR": str(self.data), "FXPILOT_TEST_MARK": self.mark})
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "demo", "--no-serve", "--port", "8320", "--time-scale", "0.01"],
                                         cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

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


@pytest.fixture
def demo(tmp_path):
    started = Demo(tmp_path)
    yield started
    started.kill_all()


def _records(demo: Demo, job_id: int) -> list[dict]:
    rows = []
    for (sha,) in demo.query(f"SELECT sha256 FROM runners_artifact WHERE job_id = {job_id} AND kind = 'records'"):
        path = demo.data / "artifacts" / sha[:2] / sha
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def test_a_worker_killed_mid_gate_is_restarted_the_run_completes_and_killing_the_demo_leaves_nothing(demo):
    demo.wait_for("G1: step 4/", 240)
    os.kill(demo.worker_pid(), signal.SIGKILL)
    demo.wait_for("the worker process stopped (exit -9); starting it again", 30)
    demo.wait_for("resumed what the worker held", 30)
    demo.wait_for("G1 run ended", 300)
    assert "G1 run ended successful" in demo.text(), demo.text()[-4000:]
    (job_id, status), = demo.query("SELECT id, status FROM runners_job ORDER BY id LIMIT 1")
    assert status == "successful"
    rows = _records(demo, job_id)
    keys = [(r["instance"], r["arm"], r["phase"], r["concurrency"], r["repetition"], r["session"]) for r in rows]
    assert rows and len(set(keys)) == len(keys), Counter(keys).most_common(3)
    # Every step ended successful; the one the kill caught was claimed again (attempt 2), none more often.
    steps = demo.query(f"SELECT status, attempts FROM runners_step WHERE job_id = {job_id}")
    assert {status for status, _ in steps} == {"successful"} and max(a for _, a in steps) <= 2, steps

    # Killed outright (no clean-up): the kernel sends its children SIGTERM.
    assert len(marked(demo.mark)) >= 6  # broker, simulated nodes, worker and its pool, beat, portal
    os.kill(demo.proc.pid, signal.SIGKILL)
    demo.proc.wait(10)
    assert not demo.left_behind(30)


def test_closing_the_demos_terminal_mid_gate_stops_everything_it_started(demo):
    demo.wait_for("G1: step 4/", 240)
    assert len(marked(demo.mark)) >= 6
    os.kill(demo.proc.pid, signal.SIGHUP)
    demo.proc.wait(90)
    assert "Stopping what the demo started (SIGHUP)" in demo.text()
    assert not demo.left_behind(30)
    (status,), = demo.query("SELECT status FROM runners_job")
    assert status == "canceled"  # the run going was canceled through the worker before it stopped
