"""Production services restarted mid-run: a gate run on PostgreSQL and Redis of its own (never the shared
ones) rides through a Redis restart and a PostgreSQL restart — the run completes, every record once — and
`run_gate --follow` rides through the database restart, saying so."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from infra.lifetime import watch_files
from tests.broker.conftest import marked, wait_for_text

pytestmark = [pytest.mark.slow]
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PgCluster:
    """A PostgreSQL cluster of this test (initdb under a temp folder, an ephemeral port)."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="fxpg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        self.run([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "fxpilot", "--auth=trust", "-E", "UTF8"])
        # pg_ctl detaches the server, whose processes write their titles over their environment (where the session's
        # watcher looks for its mark): the watcher ends the group its pid file names instead.
        watch_files(self.data / "postmaster.pid")
        self.start()
        self.run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "fxpilot", "fxpilot"])
        self.url = f"postgres://fxpilot@127.0.0.1:{self.port}/fxpilot"

    def run(self, argv: list[str]) -> None:
        subprocess.run(_as_postgres(argv), check=True, capture_output=True, timeout=600, cwd="/")

    def start(self) -> None:
        self.run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-t", "60",
                  "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1", "start"])

    def stop(self) -> None:
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]),
                       capture_output=True, timeout=600, cwd="/")

    def restart(self, down_for: float) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()

    def query(self, sql: str) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url) as conn:
            return conn.execute(sql).fetchall()


@pytest.fixture
def pg_cluster():
    if not (PG_BIN / "initdb").exists():
        pytest.skip("PostgreSQL 15 server binaries are not installed")
    cluster = PgCluster()
    yield cluster
    cluster.stop()
    shutil.rmtree(cluster.root, ignore_errors=True)


SETUP = """
from gates import lifecycle
from portal.management.commands.seed_demo import seed
from django.contrib.auth import get_user_model
pilot = seed()
User = get_user_model()
version = pilot.latest_plan
lifecycle.sign_plan(version, User.objects.get(username="alice"))
lifecycle.sign_plan(version, User.objects.get(username="bob"))
print("PILOT", pilot.code)
"""
RUN = {"time_scale": 0.02, "repetitions": 3, "fio_runtime": 1, "fio_size": "16M", "extend_marginal": False}


def test_a_gate_run_rides_through_redis_and_postgresql_restarts(procs, redis_server, pg_cluster, tmp_path):
    env = {"DATABASE_URL": pg_cluster.url, "FXPILOT_POLL_SECONDS": "0.5", "FXPILOT_STALE_SECONDS": "10",
           "FXPILOT_RECONCILE_SECONDS": "2"}
    procs.env.update(env)
    manage = [sys.executable, "manage.py"]
    assert procs.spawn("migrate", [*manage, "migrate", "-v0"]).wait(600) == 0
    setup = procs.spawn("setup", [*manage, "shell", "-c", SETUP])
    assert setup.wait(600) == 0, setup.log.read_text()
    code = setup.log.read_text().split("PILOT ")[1].split()[0]
    nodes = procs.spawn("simnodes", [*manage, "simnode", "--nodes", "2", "--dir", str(tmp_path / "sim"), "--pilot", code,
                                     "--time-scale", "0.03", "--accept-host-keys"])
    wait_for_text(nodes, "running; Ctrl-C to stop", 600)
    worker = procs.spawn("worker", [*manage, "worker", "--beat", "--concurrency", "3"])
    wait_for_text(worker, " ready.", 600)
    follow = procs.spawn("run_gate", [*manage, "run_gate", code, "G1", "--follow", "--params", json.dumps(RUN)])
    wait_for_text(follow, "measure", 600)  # the workload phases are under way
    time.sleep(2)
    redis_server.restart(down_for=2.0)
    wait_for_text(worker, "Connection to broker lost", 600)
    time.sleep(3)
    pg_cluster.restart(down_for=3.0)
    assert follow.wait(600) == 0, follow.log.read_text()[-5000:] + worker.log.read_text(errors="replace")[-5000:]

    said = follow.log.read_text()
    assert "the database does not answer" in said and "the database answers again" in said, said[-3000:]
    assert worker.poll() is None, worker.log.read_text(errors="replace")[-3000:]
    assert "Unrecoverable" not in worker.log.read_text(errors="replace")
    (job_id, status), = pg_cluster.query("SELECT id, status FROM runners_job")
    assert status == "successful"
    rows = []
    for (sha,) in pg_cluster.query(f"SELECT sha256 FROM runners_artifact WHERE job_id = {job_id} AND kind = 'records'"):
        path = Path(procs.env["FXPILOT_DATA_DIR"]) / "artifacts" / sha[:2] / sha
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keys = [(r["instance"], r["arm"], r["phase"], r["concurrency"], r["repetition"], r["session"]) for r in rows]
    # fresh sessions every repetition (docs/judge.md, "Planned looks"): 16 sessions populated for each of the 3
    assert Counter(r["phase"] for r in rows) == {"populate": 16 * 3, "measure": 16 * 3}
    assert len(set(keys)) == len(keys), Counter(keys).most_common(3)
    assert pg_cluster.query(f"SELECT verdict FROM gates_evaluation WHERE job_id = {job_id}") == [("pass",)]

    os.kill(worker.pid, signal.SIGTERM)
    worker.wait(600)
    os.killpg(nodes.pid, signal.SIGTERM)
    nodes.wait(600)
    deadline = time.monotonic() + 600
    while marked(procs.mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not marked(procs.mark)
