"""The engine at the edges, step by step in this process (issue 28): a cancel lands at the claim, at the launch,
at every poll and inside a synchronous step; an unreachable node is looked for again until the step's deadline;
a teardown that cannot reach its node is an error.

Real parts: local processes started detached (tests/orchestration/kinds.py), real SSH to simulated nodes,
a real closed port for an unreachable node. The engine's functions are called directly, so each race is
placed exactly where it must land; the fault tests with real workers are tests/orchestration/test_evidence_edges.py.
"""
from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connections, transaction
from django.utils import timezone

from runners import engine, ssh
from runners.deploy import deploy_arm
from runners.engine import execute_step, poll_step, request_cancel
from runners.gateplans import StepList
from runners.kinds import Poll, StepError, StepKind, register_kind
from runners.models import Job, Status, Step
from tests.orchestration import kinds as local_kinds
from tests.orchestration.test_engine import alive
from tests.runners.conftest import credential, make_node, pilot, simnodes, site, user_key  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def until(condition, timeout: float = 10, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s")
        time.sleep(every)


def make_job(pilot, site, build) -> Job:  # noqa: F811
    with transaction.atomic():
        job = Job.objects.create(pilot=pilot, site=site, params={})
        steps = StepList(job)
        build(steps)
        steps.save()
    return job


def _start_then_cancel(ctx):
    """The cancel lands while the process is being started: after the claim, before its pid is recorded."""
    remote = local_kinds._start(ctx)
    request_cancel(Job.objects.get(pk=ctx.step.job_id))
    return remote


register_kind(StepKind("t_edge_start", start=_start_then_cancel, poll=local_kinds._poll, finish=local_kinds._finish,
                       cancel=local_kinds._cancel, soft_time_limit=30))


def test_a_cancel_during_the_launch_kills_the_process_as_soon_as_its_pid_is_known(pilot, site):  # noqa: F811
    job = make_job(pilot, site, lambda steps: steps.add("t_edge_start", count=400, pause=0.05))
    step = job.steps.get()
    assert execute_step(step.pk, "w") == "canceled"
    step.refresh_from_db()
    assert step.status == Status.CANCELED and step.remote.get("pid")
    until(lambda: not alive(step.remote["pid"]))
    records = Path(step.remote["dir"]) / "records.jsonl"
    written = len(records.read_text().splitlines()) if records.exists() else 0
    time.sleep(0.3)
    assert (len(records.read_text().splitlines()) if records.exists() else 0) == written  # nothing more is written


def test_every_poll_looks_for_a_cancel(pilot, site):  # noqa: F811
    job = make_job(pilot, site, lambda steps: steps.add("t_work", count=400, pause=0.05))
    step = job.steps.get()
    assert execute_step(step.pk, "w") == "started"
    step.refresh_from_db()
    assert poll_step(step.pk, step.claimed_by) == "running"
    # A cancel whose own "cancel step" message never came (a broker restart lost it, or it came before the pid):
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    assert poll_step(step.pk, step.claimed_by) == "canceled"
    step.refresh_from_db()
    assert step.status == Status.CANCELED
    until(lambda: not alive(step.remote["pid"]))


def test_a_cancel_between_the_look_and_the_claim_starts_nothing(pilot, site, monkeypatch):  # noqa: F811
    job = make_job(pilot, site, lambda steps: steps.add("t_work", count=400, pause=0.05))
    step = job.steps.get()
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    # The engine looked (ready) just before the cancel was committed: the claim itself must refuse.
    monkeypatch.setattr(engine, "_readiness", lambda *args: "ready")
    assert execute_step(step.pk, "w") == "canceled before it was claimed"
    step.refresh_from_db()
    assert step.status == Status.PENDING and step.attempts == 0 and not step.remote
    monkeypatch.undo()
    engine.advance(job.pk)
    step.refresh_from_db()
    assert step.status == Status.CANCELED
    job.refresh_from_db()
    assert job.status == Status.CANCELED


# ── a synchronous step is interruptible ────────────────────────────────────────────────────────────


def _long_remote_wait(ctx):
    """Like a deploy waiting for /health: one long command on the node; then, like its teardown, a short one."""
    try:
        ssh.run(ctx.node, "sleep 60", timeout=600)
    except ssh.Interrupted as exc:
        ctx.say(f"interrupted: {exc}")
        ssh.run(ctx.node, "echo cleaned-up > ~/cleanup-ran")  # the cleanup after an interruption runs whole
        raise StepError(f"stopped: {exc}") from None
    return {"waited": True}


register_kind(StepKind("t_edge_wait", run=_long_remote_wait, soft_time_limit=120))


def test_a_synchronous_step_is_interrupted_by_a_cancel_and_its_cleanup_still_runs(pilot, site, simnodes, make_node):  # noqa: F811
    server = simnodes(1)[0]
    node = make_node(server)
    job = make_job(pilot, site, lambda steps: steps.add("t_edge_wait", node=node))
    step = job.steps.get()

    def cancel_soon():
        time.sleep(1.5)
        request_cancel(Job.objects.get(pk=job.pk))
        connections.close_all()

    canceller = threading.Thread(target=cancel_soon)
    canceller.start()
    started = time.monotonic()
    execute_step(step.pk, "w")
    took = time.monotonic() - started
    canceller.join()
    step.refresh_from_db()
    assert took < 8, f"the cancel took {took:.1f} s to land in a synchronous step"
    assert step.status == Status.CANCELED and "the run was canceled" in step.error
    assert (server.root / "cleanup-ran").read_text().strip() == "cleaned-up"


# ── re-attach until the step's deadline ────────────────────────────────────────────────────────────


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _look_at_the_node(ctx) -> Poll:
    ssh.run(ctx.node, "true", timeout=10)  # a node that does not answer: Unreachable, a transient error
    return Poll(running=True)


register_kind(StepKind("t_edge_away", start=lambda ctx: {"dir": "/tmp/x", "pid": 12345, "pgid": 12345},
                       poll=_look_at_the_node, cancel=lambda ctx: ssh.run(ctx.node, "true", timeout=10) and None,
                       soft_time_limit=30, max_seconds=lambda step: step.params.get("deadline")))


def test_an_unreachable_node_is_looked_for_again_until_the_step_s_deadline(
        pilot, site, make_node, settings, simnodes):  # noqa: F811
    server = simnodes(1)[0]
    node = make_node(server, port=_closed_port())  # the node's SSH does not answer (connection refused)
    settings.FXPILOT_POLL_SECONDS = 0.25
    settings.FXPILOT_REATTACH_MAX_SECONDS = 2.0
    settings.FXPILOT_STEP_MAX_ATTEMPTS = 4
    job = make_job(pilot, site, lambda steps: steps.add("t_edge_away", node=node, deadline=3600))
    step = job.steps.get()
    assert execute_step(step.pk, "w") == "started"
    step.refresh_from_db()
    delays = []
    sent = engine.dispatch_poll
    engine.dispatch_poll = lambda step, token, countdown: delays.append(countdown)  # the looks are made here
    try:
        # Far more failed looks than the former limit (12 with four attempts): the step keeps waiting.
        for _ in range(40):
            assert poll_step(step.pk, step.claimed_by) == "retry"
        step.refresh_from_db()
        assert step.status == Status.RUNNING and step.remote["poll_failures"] == 40
        assert max(delays) == 2.0 and delays[0] == 0.25  # capped back-off: seconds, never a minute
        text = "".join(job.chunks.values_list("text", flat=True))
        assert text.count("will re-attach") == 1  # said once (then once a minute), not at every look

        # Past the deadline it is an error that says so and that the process may still run.
        Step.objects.filter(pk=step.pk).update(params={**step.params, "deadline": 5},
                                               started=step.started - timedelta(seconds=10))
        assert poll_step(step.pk, step.claimed_by) == "error"
    finally:
        engine.dispatch_poll = sent
    step.refresh_from_db()
    assert step.status == Status.ERROR
    assert "deadline (5 s after its start) has passed" in step.error and "may still be running" in step.error
    assert f"node {node.name}" in step.error


# ── a teardown that cannot reach its node ──────────────────────────────────────────────────────────


@pytest.mark.parametrize("canceled", [False, True], ids=["run-error", "run-canceled"])
def test_a_teardown_that_cannot_reach_its_node_is_an_error(pilot, site, simnodes, make_node, canceled):  # noqa: F811
    server = simnodes(1, time_scale=0.001)[0]
    node = make_node(server)

    def build(steps: StepList) -> None:
        deploy = steps.add("note", node=node, text="deployed")
        steps.add("teardown", node=node, after_done=[deploy], always=True, deploy=deploy)

    job = make_job(pilot, site, build)
    deploy, teardown = job.steps.order_by("seq")
    deployment = deploy_arm(job, deploy, node, "recompute", time_scale=0.001)
    Step.objects.filter(pk=deploy.pk).update(status=Status.SUCCESSFUL, result={"deployment": deployment.to_dict()},
                                             started=timezone.now())
    server.rekey()  # the node now offers another host key: nothing can be done there
    if canceled:
        request_cancel(job)
    execute_step(teardown.pk, "w")
    teardown.refresh_from_db()
    assert teardown.status == Status.ERROR, (teardown.status, teardown.error)
    assert "HOST KEY CHANGED" in teardown.error and "teardown" in teardown.error
    from runners.simnode.server import _kill_sandbox_processes

    _kill_sandbox_processes(server.root)  # the server the teardown could not stop


def test_a_cancel_that_cannot_reach_the_node_is_tried_again_until_the_deadline_then_ends_the_step(
        pilot, site, make_node, settings, simnodes):  # noqa: F811
    server = simnodes(1)[0]
    node = make_node(server, port=_closed_port())
    settings.FXPILOT_POLL_SECONDS = 0.25
    job = make_job(pilot, site, lambda steps: steps.add("t_edge_away", node=node, deadline=3600))
    step = job.steps.get()
    assert execute_step(step.pk, "w") == "started"
    step.refresh_from_db()
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    sent = engine.dispatch_poll
    engine.dispatch_poll = lambda *args: None
    try:
        assert poll_step(step.pk, step.claimed_by) == "cancel retry"  # the node may answer in a moment
        step.refresh_from_db()
        assert step.status == Status.RUNNING
        Step.objects.filter(pk=step.pk).update(params={**step.params, "deadline": 5},
                                               started=step.started - timedelta(seconds=10))
        assert poll_step(step.pk, step.claimed_by) == "canceled"
    finally:
        engine.dispatch_poll = sent
    step.refresh_from_db()
    assert step.status == Status.CANCELED
    assert step.error.startswith("canceled, but its remote process could not be killed:") and "node1" in step.error


def test_a_teardown_during_an_ssh_outage_is_tried_again_not_an_error(pilot, site, simnodes, make_node):  # noqa: F811
    from runners.teardown import teardown_arm
    from tests.runners.conftest import set_faults

    server = simnodes(1, time_scale=0.001)[0]
    node = make_node(server)
    job = make_job(pilot, site, lambda steps: steps.add("note", node=node, text="deployed"))
    deployment = deploy_arm(job, None, node, "recompute", time_scale=0.001)
    set_faults(server, drop_ssh_after_seconds=0)  # the node is away: every command is dropped
    with pytest.raises(ssh.ConnectionLost) as raised:
        teardown_arm(job, None, node, deployment)
    assert raised.value.transient and "teardown incomplete" in str(raised.value)
    set_faults(server, drop_ssh_after_seconds=None)
    done = teardown_arm(job, None, node, deployment)  # the orchestrator's next attempt
    assert done.torn_down
    pid = deployment.server["pid"]
    assert not alive(pid)
