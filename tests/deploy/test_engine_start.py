"""The deploy's wait for /health over real SSH on a simulated node: LMCache failing to initialise fails the
deploy with the server's own line, and a cancel reaches a server that is still starting."""
from __future__ import annotations

import threading
import time

import pytest

from runners.config import default_simulated
from runners.deploy import deploy_arm
from runners.deployment import DeployError
from runners.models import Job, Step
from runners.simnode.state import update_state
from tests.runners.conftest import job_text


def _faults(server, **faults) -> None:
    update_state(server.root, lambda state: state["faults"].update(faults))


def test_lmcache_failing_to_initialise_fails_the_deploy_with_the_servers_line(sim_nodes):
    node, server = sim_nodes.nodes[0], sim_nodes.servers[0]
    _faults(server, lmcache_init_fails=True)
    step = Step.objects.create(job=sim_nodes.job, seq=1, name="deploy", node=node, arm="local_nvme")
    with pytest.raises(DeployError, match="LMCache failed to initialise") as caught:
        deploy_arm(sim_nodes.job, step, node, "local_nvme")
    assert "degraded mode (recompute)" in str(caught.value)
    step.refresh_from_db()
    assert step.result["deployment"]["torn_down"] is True


def test_the_recompute_arm_does_not_look_for_lmcache(sim_nodes):
    node, server = sim_nodes.nodes[1], sim_nodes.servers[1]
    _faults(server, lmcache_init_fails=True)
    deployment = deploy_arm(sim_nodes.job, None, node, "recompute")
    assert deployment.healthy


@pytest.mark.django_db(transaction=True)
def test_a_cancel_stops_a_deploy_waiting_for_health_and_kills_the_server(sim_nodes):
    node, server = sim_nodes.nodes[0], sim_nodes.servers[0]
    _faults(server, slow_start_seconds=120)
    sim_nodes.pilot.deployment = default_simulated() | {"health_timeout_s": 600}
    sim_nodes.pilot.save()
    job = sim_nodes.job
    step = Step.objects.create(job=job, seq=1, name="deploy", node=node, arm="recompute")
    outcome: dict = {}

    def run() -> None:
        from django.db import connection

        try:
            deploy_arm(job, step, node, "recompute")
        except DeployError as exc:
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and "waiting for /health" not in job_text(job):
        time.sleep(0.5)
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    started = time.monotonic()
    thread.join(600)
    assert not thread.is_alive()
    assert time.monotonic() - started < 600
    assert "canceled while waiting for /health" in str(outcome["error"])
    text = job_text(job)
    assert "loading the model (fault slow_start_seconds=120)" in text        # the server log, live
    step.refresh_from_db()
    deployment = step.result["deployment"]
    assert deployment["torn_down"] is True
    from runners import ssh

    left = ssh.run(node, f"ps -eo pgid=,stat= | awk '$1 == {deployment['server']['pgid']} && $2 !~ /^Z/' | wc -l")
    assert left.stdout.strip() == "0"
