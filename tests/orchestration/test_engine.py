"""The engine alone, with real workers and a real broker, on local stand-in steps (tests/orchestration/kinds.py)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from django.db import transaction

from runners.dispatch import dispatch_advance
from runners.gateplans import StepList
from runners.models import Job, Status, Step
from runners.orchestration import job_progress, request_cancel, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def local_job(pilot, site, build) -> Job:
    with transaction.atomic():
        job = Job.objects.create(pilot=pilot, gate=pilot.gate(1), site=site, params={})
        steps = StepList(job)
        build(steps)
        steps.save()
        transaction.on_commit(lambda: dispatch_advance(job.pk))
    return job


def two_lanes(nodes, count=6, pause=0.2):
    """node1: note → work → note; node2: work; then a control-queue note after both."""

    def build(steps: StepList) -> None:
        a = steps.add("t_note", node=nodes[0])
        b = steps.add("t_work", node=nodes[0], after=[a], count=count, pause=pause)
        c = steps.add("t_note", node=nodes[0], after=[b])
        d = steps.add("t_work", node=nodes[1], count=count, pause=pause)
        steps.add("t_note", after=[c, d])

    return build


def until(condition, timeout: float = 600, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s")
        time.sleep(every)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"


def test_a_run_completes_through_real_workers_with_progress_and_a_numbered_log(cluster, signed_pilot, local_site):
    site, nodes = local_site
    cluster.worker("all", [cluster.control, site.queue])
    job = local_job(signed_pilot.pilot, site, two_lanes(nodes))
    job = wait_for(job, 600)
    assert job.status == Status.SUCCESSFUL, cluster.logs()
    steps = list(job.steps.order_by("seq"))
    assert [s.status for s in steps] == [Status.SUCCESSFUL] * 5
    assert all(s.attempts == 1 for s in steps)
    assert steps[1].result == {"records": 6, "exit_code": 0}
    assert (steps[1].requests_done, steps[1].requests_total) == (6, 6)
    seqs = list(job.chunks.values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    progress = job_progress(job)
    assert (progress["steps_finished"], progress["steps_total"], progress["requests_done"]) == (5, 5, 12)
    assert "PROGRESS 6 6" in "".join(job.chunks.values_list("text", flat=True))


def test_a_step_error_ends_the_run_in_error_naming_the_step_and_the_reason(cluster, signed_pilot, local_site):
    site, nodes = local_site
    cluster.worker("all", [cluster.control, site.queue])

    def build(steps: StepList) -> None:
        a = steps.add("t_work", node=nodes[0], count=3, pause=0.1, exit=7)
        b = steps.add("t_note", node=nodes[0], after=[a])
        steps.add("t_note", node=nodes[0], after_done=[a, b], always=True)

    job = wait_for(local_job(signed_pilot.pilot, site, build), 600)
    assert job.status == Status.ERROR, cluster.logs()
    assert job.error == "step 1 t_work on node1: the local process exited with code 7"
    statuses = list(job.steps.order_by("seq").values_list("status", flat=True))
    # The dependent step never ran; the clean-up step ran anyway.
    assert statuses == [Status.ERROR, Status.CANCELED, Status.SUCCESSFUL]
    signed_pilot.pilot.refresh_from_db()
    assert signed_pilot.pilot.state == "active"


def test_a_worker_killed_mid_step_is_replaced_and_nothing_runs_twice(cluster, signed_pilot, local_site):
    site, nodes = local_site
    worker = cluster.worker("first", [cluster.control, site.queue])
    cluster.reconciler()
    job = local_job(signed_pilot.pilot, site, two_lanes(nodes, count=20, pause=0.25))
    work = Step.objects.get(job=job, seq=2)
    until(lambda: work.refresh_from_db() or work.requests_done >= 3)
    assert work.status == Status.RUNNING and work.requests_done >= 3, cluster.logs()
    worker.kill()
    cluster.worker("second", [cluster.control, site.queue])
    job = wait_for(job, 600)
    assert job.status == Status.SUCCESSFUL, cluster.logs()
    steps = list(job.steps.order_by("seq"))
    assert [s.attempts for s in steps] == [1, 1, 1, 1, 1]
    records = Path(steps[1].remote["dir"], "records.jsonl").read_text().splitlines()
    assert [json.loads(line)["i"] for line in records] == list(range(1, 21))
    assert steps[1].result["records"] == 20
    assert "following the remote process again" in "".join(job.chunks.values_list("text", flat=True))


def test_cancel_mid_run_kills_the_processes_and_ends_canceled(cluster, signed_pilot, local_site):
    site, nodes = local_site
    cluster.worker("all", [cluster.control, site.queue])

    def build(steps: StepList) -> None:
        a = steps.add("t_work", node=nodes[0], count=200, pause=0.1)
        b = steps.add("t_work", node=nodes[1], count=200, pause=0.1)
        c = steps.add("t_note", node=nodes[0], after=[a, b])
        steps.add("t_note", node=nodes[0], after_done=[a, b, c], always=True)

    job = local_job(signed_pilot.pilot, site, build)
    until(lambda: Step.objects.filter(job=job, status=Status.RUNNING, requests_done__gte=2).count() == 2)
    pids = [s.remote["pid"] for s in job.steps.filter(status=Status.RUNNING)]
    assert len(pids) == 2, cluster.logs()
    request_cancel(job, signed_pilot.alice)
    job = wait_for(job, 600)
    assert job.status == Status.CANCELED, cluster.logs()
    assert list(job.steps.order_by("seq").values_list("status", flat=True)) == [
        Status.CANCELED, Status.CANCELED, Status.CANCELED, Status.SUCCESSFUL]
    until(lambda: not [pid for pid in pids if alive(pid)], timeout=600)


def test_two_workers_on_two_site_queues_each_run_only_their_sites_steps(cluster, signed_pilot, local_site):
    from runners.models import Node, Site

    site_a, nodes_a = local_site
    site_b = Site.objects.create(pilot=signed_pilot.pilot, name="lab-b", queue=f"{site_a.queue}-b")
    nodes_b = [Node.objects.create(site=site_b, name=f"b{i}", host="127.0.0.1", username="fxpilot") for i in (1, 2)]
    cluster.worker("wa", [cluster.control, site_a.queue])
    cluster.worker("wb", [site_b.queue])
    job_a = local_job(signed_pilot.pilot, site_a, two_lanes(nodes_a, count=3, pause=0.05))
    job_b = local_job(signed_pilot.pilot, site_b, two_lanes(nodes_b, count=3, pause=0.05))
    for job in (job_a, job_b):
        assert wait_for(job, 600).status == Status.SUCCESSFUL, cluster.logs()
    for job, site_worker in ((job_a, "wa@"), (job_b, "wb@")):
        for step in job.steps.exclude(node=None):
            assert step.result.get("worker", step.remote.get("worker", "")).startswith(site_worker), step
        # Control work (no node) goes to the control queue, which only worker A serves.
        assert job.steps.get(node=None).result["worker"].startswith("wa@")


def test_the_worker_command_serves_the_control_queue_and_every_sites_queue(cluster, local_site):
    import os
    import signal
    import subprocess
    import sys

    from runners.queues import CHECK_QUEUE, all_queues
    from tests.orchestration.conftest import ROOT

    site, _ = local_site
    # the control queue, the PDF checks' own (a check never waits behind a gate run's steps, nor they behind it),
    # then every site's
    assert all_queues() == [cluster.control, CHECK_QUEUE, site.queue]
    proc = subprocess.Popen([sys.executable, "manage.py", "worker", "--concurrency", "1", "--hostname", "cmd@%h"],
                            cwd=ROOT, env=cluster.environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if " ready." in line:
                break
        text = "".join(lines)
        assert f"worker on {cluster.control}, {CHECK_QUEUE}, {site.queue}" in text
        assert f".> {site.queue}" in text and "cmd@" in text
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=600)


def test_an_error_of_a_step_that_does_not_decide_the_outcome_is_shown_but_keeps_the_run_successful(
        cluster, signed_pilot, local_site):
    site, nodes = local_site
    cluster.worker("all", [cluster.control, site.queue])

    def build(steps: StepList) -> None:
        a = steps.add("t_note", node=nodes[0])
        steps.add("t_aside", after_verdict=[a], explode="the report renderer is not installed")

    job = wait_for(local_job(signed_pilot.pilot, site, build), 600)
    assert job.status == Status.SUCCESSFUL, cluster.logs()
    assert job.error == ""
    aside = job.steps.get(seq=2)
    assert aside.status == Status.ERROR and aside.error == "the report renderer is not installed"
