"""Every byte the node recorded is kept whatever the outcome, and a run leaves no SSH session behind."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from runners.artifacts import read_artifact
from runners.models import Status
from runners.orchestration import start_gate_run, wait_for
from tests.orchestration.conftest import FAST_RUN, cold_recovery_records
from tests.orchestration.test_gate_runs import explain
from tests.runners.conftest import set_faults

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def ours(pid: int) -> bool:
    """The process belongs to this test session: it carries the session's own data folder (its workers do)."""
    needle = f"FXPILOT_DATA_DIR={os.environ['FXPILOT_DATA_DIR']}".encode()
    try:
        return pid == os.getpid() or needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def established(port: int) -> list[str]:
    """This session's established connections to a simulated node's port (a parallel session's are not ours)."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{port} and dst 127.0.0.1 )"],
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines()
            if any(ours(int(pid)) for pid in re.findall(r"pid=(\d+),", line))]


def test_a_server_killed_mid_measure_keeps_the_records_written_before_the_crash(cluster, sim_site, client):
    cluster.worker("all", [cluster.control, sim_site.site.queue], concurrency=3)
    set_faults(sim_site.servers[0], server_crash_after_requests=20)
    job = start_gate_run(sim_site.pilot.gate(1), sim_site.people.alice, site=sim_site.site, params=FAST_RUN)
    job = wait_for(job, 600)
    assert job.status == Status.ERROR, explain(job, cluster)
    statuses = dict(job.steps.exclude(node__name="node2").values_list("name", "status"))  # node2: its cold start
    assert statuses["measure"] == Status.ERROR and statuses["collect"] == Status.CANCELED
    assert statuses["teardown"] == Status.SUCCESSFUL, explain(job, cluster)

    kept = {a.name: a for a in job.artifacts.filter(outcome="error")}
    records = {name: a for name, a in kept.items() if a.kind == "records"}
    assert any(name.endswith("-populate.jsonl") for name in records), sorted(kept)
    measure = [a for name, a in records.items() if name.endswith("-measure.jsonl")]
    assert len(measure) == 1, sorted(kept)
    rows = [json.loads(line) for line in read_artifact(measure[0]).decode().splitlines() if line.strip()]
    # The measure step's file holds the repetitions it measured and, with fresh sessions every repetition (judge
    # version 3), each later repetition's own sessions, populated by it (phase populate); the crash cut it short.
    assert rows and any(r["phase"] == "measure" for r in rows) and {r["phase"] for r in rows} <= {"measure", "populate"}
    assert all(r["repetition"] > 1 for r in rows if r["phase"] == "populate"), Counter(
        (r["phase"], r["repetition"]) for r in rows)
    whole = cold_recovery_records(FAST_RUN)
    first_populate = whole["populate"] // FAST_RUN["repetitions"]  # the populate step's
    assert len(rows) < job.steps.get(name="measure").requests_total == sum(whole.values()) - first_populate
    # The bytes are those on the node, whole (hashed there and here).
    on_node = next(sim_site.servers[0].root.rglob(measure[0].name.rsplit("/", 1)[-1]))
    assert read_artifact(measure[0]) == on_node.read_bytes()
    assert any(a.kind == "server-log" for a in job.artifacts.all())
    assert not job.steps.get(name="evaluate").result

    # The run page lists them, with the outcome.
    client.force_login(sim_site.people.alice)
    page = client.get(f"/runs/{job.code}/").content.decode()
    assert measure[0].name in page and "kept after error" in page

    # No SSH session of the run stays open on either node.
    deadline = time.monotonic() + 600
    while any(established(s.port) for s in sim_site.servers) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [line for s in sim_site.servers for line in established(s.port)]
    assert not left, "\n".join(left)
