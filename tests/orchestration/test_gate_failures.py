"""What goes wrong during a gate run on simulated nodes: a worker killed, SSH dropping, a server crash, a cancel."""
from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from gates.models import Evaluation, Gate, Pilot
from runners.models import Status, Step
from runners.orchestration import request_cancel, start_gate_run, wait_for
from tests.orchestration.conftest import FAST_RUN, cold_recovery_records
from tests.orchestration.test_gate_runs import assert_judged, explain, records_of, request_key
from tests.runners.conftest import set_faults

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Slower than FAST_RUN so that measure lasts long enough to be interrupted.
SLOW_MEASURE = {**FAST_RUN, "time_scale": 0.03, "repetitions": 3}


def until(condition, timeout: float = 600, every: float = 0.1, why=None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s" + (f": {why()}" if why else ""))
        time.sleep(every)


def measuring(job, at_least: int = 1):
    def check() -> bool:
        return Step.objects.filter(job=job, name="measure", status=Status.RUNNING, requests_done__gte=at_least).exists()
    return check


def processes_under(root: Path) -> list[str]:
    """Live processes whose command line or working directory lies in a simulated node's sandbox."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = str((proc / "cwd").resolve())
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        if str(root) in cmdline or cwd.startswith(str(root)):
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def test_a_worker_killed_during_measure_is_replaced_and_no_step_or_record_is_repeated(cluster, sim_site):
    first = cluster.worker("first", [cluster.control, sim_site.site.queue], concurrency=3)
    cluster.reconciler()
    job = start_gate_run(sim_site.pilot.gate(1), sim_site.people.alice, site=sim_site.site, params=SLOW_MEASURE)
    until(measuring(job, 2), why=lambda: explain(job, cluster))
    first.kill()
    cluster.worker("second", [cluster.control, sim_site.site.queue], concurrency=3)
    job = wait_for(job, 600)
    assert_judged(job, cluster)
    assert [s.attempts for s in job.steps.order_by("seq")] == [1] * 12, explain(job, cluster)
    rows = records_of(job)
    assert Counter(r["phase"] for r in rows) == cold_recovery_records(SLOW_MEASURE)
    assert len({request_key(r) for r in rows}) == len(rows)
    assert "its worker went silent" in "".join(job.chunks.values_list("text", flat=True))


def test_ssh_dropping_during_measure_is_survived_by_re_attaching(cluster, sim_site):
    cluster.worker("all", [cluster.control, sim_site.site.queue], concurrency=3)
    job = start_gate_run(sim_site.pilot.gate(1), sim_site.people.alice, site=sim_site.site, params=SLOW_MEASURE)
    until(measuring(job, 2), why=lambda: explain(job, cluster))
    set_faults(sim_site.servers[0], drop_ssh_after_seconds=0)
    until(lambda: "will re-attach" in "".join(job.chunks.values_list("text", flat=True)), timeout=600)
    time.sleep(1.5)
    set_faults(sim_site.servers[0], drop_ssh_after_seconds=None)
    job = wait_for(job, 600)
    assert_judged(job, cluster)
    text = "".join(job.chunks.values_list("text", flat=True))
    assert "re-attached to the remote process" in text
    rows = records_of(job)
    assert Counter(r["phase"] for r in rows) == cold_recovery_records(SLOW_MEASURE)
    assert Step.objects.get(job=job, name="measure").attempts == 1


def test_a_server_crash_ends_the_run_in_error_naming_the_step_and_leaves_the_pilot_running(cluster, sim_site):
    cluster.worker("all", [cluster.control, sim_site.site.queue], concurrency=3)
    set_faults(sim_site.servers[0], server_crash_after_requests=20)
    job = start_gate_run(sim_site.pilot.gate(1), sim_site.people.alice, site=sim_site.site, params=FAST_RUN)
    job = wait_for(job, 600)
    assert job.status == Status.ERROR, explain(job, cluster)
    assert job.error.startswith("step 6 measure [recompute] on node1: "
                                "the recompute server on node1 exited during measure")
    statuses = dict(job.steps.exclude(node__name="node2").values_list("name", "status"))  # node2: its cold start
    assert statuses["teardown"] == Status.SUCCESSFUL
    assert statuses["evaluate"] == Status.CANCELED
    assert not Evaluation.objects.filter(job=job).exists()
    pilot = Pilot.objects.get(pk=sim_site.pilot.pk)
    assert pilot.state == Pilot.State.ACTIVE
    assert pilot.gate(1).state == Gate.State.OPEN
    assert not processes_under(sim_site.servers[0].root)


def test_cancel_during_measure_ends_canceled_with_no_process_left_on_the_nodes(cluster, sim_site):
    cluster.worker("all", [cluster.control, sim_site.site.queue], concurrency=3)
    job = start_gate_run(sim_site.pilot.gate(1), sim_site.people.alice, site=sim_site.site, params=SLOW_MEASURE)
    until(measuring(job, 2), why=lambda: explain(job, cluster))
    request_cancel(job, sim_site.people.alice)
    job = wait_for(job, 600)
    assert job.status == Status.CANCELED, explain(job, cluster)
    statuses = dict(job.steps.exclude(node__name="node2").values_list("name", "status"))  # node2: its cold start
    assert statuses["measure"] == Status.CANCELED and statuses["teardown"] == Status.SUCCESSFUL
    assert statuses["evaluate"] == Status.CANCELED
    for server in sim_site.servers:
        assert not processes_under(server.root)
    assert Pilot.objects.get(pk=sim_site.pilot.pk).gate(1).state == Gate.State.OPEN
