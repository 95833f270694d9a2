"""Real Celery workers for the orchestration tests: subprocesses on the test database and a real broker.

The broker is the Redis server CELERY_BROKER_URL names (CI), else the test session's embedded
Redis broker (tests/envsetup.py). Workers read the same test database: SQLite's test database is
a file; for PostgreSQL the test database's name goes to the worker through DATABASE_URL.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from runners.models import Node, Site
from runners.queues import CONTROL_QUEUE

ROOT = Path(__file__).resolve().parents[2]
# Fast clocks for the tests: poll often, call a heartbeat stale after a few seconds.
FAST = {"FXPILOT_POLL_SECONDS": 0.25, "FXPILOT_STALE_SECONDS": 4.0, "FXPILOT_RECONCILE_SECONDS": 1.0}


def database_url() -> str:
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return "sqlite:///" + str(Path(db["NAME"]).resolve())
    auth = quote(db["USER"] or "") + (":" + quote(db["PASSWORD"]) if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"


def purge(queues: list[str]) -> None:
    """Messages left by an earlier test must not reach this test's workers."""
    from fxpilot.celery import app

    with app.connection_for_write() as conn:
        for queue in queues:
            conn.default_channel.queue_purge(queue)


class Worker:
    def __init__(self, name: str, queues: list[str], env: dict, log_dir: Path, concurrency: int = 2):
        self.name, self.queues, self.env, self.concurrency = name, queues, env, concurrency
        self.log = log_dir / f"worker-{name}-{uuid.uuid4().hex[:6]}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Worker:
        argv = [sys.executable, "-m", "celery", "-A", "fxpilot", "worker", "-Q", ",".join(self.queues),
                "-c", str(self.concurrency), "-P", "prefork", "-n", f"{self.name}@%h", "-l", "INFO",
                "--without-gossip", "--without-mingle", "--without-heartbeat", "--include", "tests.orchestration.kinds"]
        handle = open(self.log, "ab")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if " ready." in self.log.read_text(errors="replace"):
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"worker {self.name} not ready:\n{self.log.read_text(errors='replace')[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and pool children), as a crash would."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=600)

    def stop(self) -> None:
        # The test is over: no warm shutdown (it waits for the countdowns it holds); the next test purges its queues.
        self.kill()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


class Reconciler:
    """`manage.py reconcile --loop`, as production runs it next to the workers."""

    def __init__(self, env: dict, log_dir: Path):
        self.env, self.log = env, log_dir / f"reconcile-{uuid.uuid4().hex[:6]}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Reconciler:
        self.proc = subprocess.Popen([sys.executable, "manage.py", "reconcile", "--loop", "--interval", "1"], cwd=ROOT,
                                     env=self.env, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=600)


def wait_finished(row, cluster, seconds: float, every: float = 0.5):
    """A row a worker carries to its end (a report job, a PDF check: `is_finished`), followed from the test as the
    pages follow it by polling; fails with the cluster's logs when it is not done within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row.refresh_from_db()
        if row.is_finished:
            return row
        time.sleep(every)
    raise AssertionError(f"{type(row).__name__} still {row.state} after {seconds}s\n{cluster.logs()}")


@pytest.fixture
def fast_settings(settings):
    for name, value in FAST.items():
        setattr(settings, name, value)
    return settings


@pytest.fixture
def cluster(transactional_db, fast_settings, tmp_path):
    """Start workers and a reconcile loop on demand; everything started is stopped at the end."""
    env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONPATH": str(ROOT),
           **{name: str(value) for name, value in FAST.items()}}
    started: list = []

    class Cluster:
        control = CONTROL_QUEUE
        environment = env

        def worker(self, name: str, queues: list[str], concurrency: int = 2) -> Worker:
            purge(queues)
            worker = Worker(name, queues, env, tmp_path, concurrency).start()
            started.append(worker)
            return worker

        def reconciler(self) -> Reconciler:
            loop = Reconciler(env, tmp_path).start()
            started.append(loop)
            return loop

        def logs(self) -> str:
            return "\n".join(f"==== {p.log.name}\n{p.log.read_text(errors='replace')[-4000:]}" for p in started)

    yield Cluster()
    for proc in reversed(started):
        proc.stop()


@pytest.fixture
def local_site(signed_pilot):
    """A site with two nodes that the local test kinds never contact (their steps run on the worker)."""
    suffix = uuid.uuid4().hex[:6]
    site = Site.objects.create(pilot=signed_pilot.pilot, name=f"lab-{suffix}", queue=f"site-lab-{suffix}")
    nodes = [Node.objects.create(site=site, name=f"node{i}", host="127.0.0.1", port=22, username="fxpilot")
             for i in (1, 2)]
    return site, nodes


# Simulated nodes over real SSH (tests/runners/conftest.py): served by threads of this test process,
# reached by the worker processes over loopback SSH like any node.
from tests.runners.conftest import simnodes, user_key  # noqa: E402, F401


@pytest.fixture
def sim_site(signed_pilot, simnodes, user_key):  # noqa: F811
    """Two simulated nodes of a site of the signed demo pilot, host keys accepted."""
    from types import SimpleNamespace

    from runners.credentials import create_credential

    servers = simnodes(2)
    suffix = uuid.uuid4().hex[:6]
    site = Site.objects.create(pilot=signed_pilot.pilot, name=f"sim-{suffix}", queue=f"site-sim-{suffix}")
    credential = create_credential(site, "test key", user_key.text)
    nodes = []
    for server in servers:
        key = server.host_key
        nodes.append(Node.objects.create(
            site=site, name=server.name, host="127.0.0.1", port=server.port, username=server.username,
            credential=credential, simulated=True, host_key_state=Node.HostKeyState.ACCEPTED,
            host_key_type=key.get_name(), host_key=key.get_base64(), host_key_fingerprint=key.fingerprint))
    return SimpleNamespace(site=site, nodes=nodes, servers=servers, pilot=signed_pilot.pilot, people=signed_pilot)


# Small and fast: a tiny time scale and few requests, still enough for the judge's minimum per cell. A soak of a
# few seconds ends at its length (no floor of the plan's 3,911 requests: test_gate_runs_g2_g4 sets a small one).
FAST_RUN = {"time_scale": 0.002, "repetitions": 2, "fio_runtime": 1, "fio_size": "16M", "extend_marginal": False,
            "soak_min_requests": 0,
            "workloads": {"cold_recovery": {"requests_per_client": 1, "prompt_tokens": 8192},
                          "probe_prompts": {"prompts": 4, "prompt_tokens": 1024}}}


def cold_recovery_records(params: dict, concurrency: int | None = None) -> dict[str, int]:
    """The records a whole cold-recovery arm at one level writes, by phase, for a run with these job parameters
    (G1 by default). Judge version 3 sends fresh sessions every repetition (docs/judge.md, "Planned looks"): the
    populate step writes the first repetition's sessions, the measure step each later repetition's (phase
    populate) before measuring it, so every repetition populates and measures its own sessions."""
    from runners.gateplans import G1_CONCURRENCY

    sessions = (concurrency or G1_CONCURRENCY) * int(params["workloads"]["cold_recovery"]["requests_per_client"])
    repetitions = int(params["repetitions"])
    return {"populate": sessions * repetitions, "measure": sessions * repetitions}


def open_gate(pilot, number: int, people) -> None:
    """Walk the lifecycle up to gate `number` open: each earlier gate passes and both parties sign it off."""
    from gates import lifecycle
    from gates.models import Evaluation

    for earlier in range(1, number):
        gate = pilot.gate(earlier)
        result = {"verdict": "pass", "gate": earlier, "criteria": []}
        evaluation = Evaluation.objects.create(gate=gate, plan_version=pilot.signed_plan, verdict="pass", result=result,
                                               simulated=True)
        lifecycle.record_verdict(gate, evaluation, who="test")
        lifecycle.sign_off_gate(gate, people.alice, decision="approve")
        lifecycle.sign_off_gate(gate, people.bob, decision="approve")
