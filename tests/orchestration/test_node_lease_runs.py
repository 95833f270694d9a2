"""Two pilots on the same machines: the second run waits for the first (or, asked not to wait, is refused naming it); neither verdict changes."""
from __future__ import annotations

import uuid

import pytest

from gates.models import Evaluation, Gate, Pilot
from runners.models import Node, NodeLease, Site, Status
from runners.orchestration import RunRefused, start_gate_run, wait_for
from tests.orchestration.conftest import FAST_RUN
from tests.orchestration.test_gate_runs import assert_judged, explain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _second_pilot_on_the_same_machines(sim_site, people):
    """Pilot B: a pilot of its own with its own site, registering the very machines pilot A uses."""
    from gates import lifecycle

    pilot = lifecycle.create_pilot(name="Pilot B", customer=sim_site.pilot.customer, vendor=sim_site.pilot.vendor,
                                   who="test", deployment=sim_site.pilot.deployment)
    lifecycle.sign_plan(pilot.latest_plan, people.alice)
    lifecycle.sign_plan(pilot.latest_plan, people.bob)
    site = Site.objects.create(pilot=pilot, name="B's lab", queue=f"site-b-{uuid.uuid4().hex[:6]}")
    for node in sim_site.nodes:
        Node.objects.create(site=site, name=node.name, host=node.host, port=node.port, username=node.username,
                            credential=node.credential, simulated=True, host_key_state=node.host_key_state,
                            host_key_type=node.host_key_type, host_key=node.host_key,
                            host_key_fingerprint=node.host_key_fingerprint)
    return Pilot.objects.get(pk=pilot.pk), site


def test_a_second_pilot_on_the_same_nodes_waits_for_the_first_then_runs_and_neither_verdict_changes(cluster, sim_site):
    other, other_site = _second_pilot_on_the_same_machines(sim_site, sim_site.people)
    cluster.worker("all", [cluster.control, sim_site.site.queue, other_site.queue], concurrency=3)
    job = start_gate_run(sim_site.pilot.gate(1), sim_site.people.alice, site=sim_site.site, params=FAST_RUN)
    assert NodeLease.objects.filter(job=job).count() >= 2

    # "Do not wait": refused, naming the run that holds the machines; nothing of pilot B's is created.
    with pytest.raises(RunRefused) as refused:
        start_gate_run(other.gate(1), sim_site.people.alice, site=other_site, params=FAST_RUN, wait=False)
    message = str(refused.value)
    assert f"in use by G1 run {str(job.code)[:8]} of pilot {sim_site.pilot.name}" in message, message
    assert not other.jobs.exists()

    # Waiting (the default): pilot B's run is created, says what it waits for, and starts by itself.
    second = start_gate_run(other.gate(1), sim_site.people.alice, site=other_site, params=FAST_RUN)
    assert second.waiting_on == job and not NodeLease.objects.filter(job=second).exists()
    waiting = f"held by G1 run {str(job.code)[:8]} of pilot {sim_site.pilot.name}"
    assert waiting in "".join(second.chunks.values_list("text", flat=True))

    job = wait_for(job, 600)
    evaluation = assert_judged(job, cluster)
    second.refresh_from_db()
    assert second.started is None or second.started >= job.finished, explain(second, cluster)
    second = wait_for(second, 600)
    other_evaluation = assert_judged(second, cluster)
    assert not second.steps.filter(status=Status.ERROR).exists(), explain(second, cluster)
    first_step = second.steps.filter(started__isnull=False).order_by("started").first()
    assert first_step.started >= job.finished  # nothing of B's touched the machines while A held them
    # Neither verdict changed: A's stands as judged, B's is its own run's.
    assert Gate.objects.get(pk=sim_site.pilot.gate(1).pk).verdict == evaluation.verdict
    assert Gate.objects.get(pk=other.gate(1).pk).verdict == other_evaluation.verdict
    assert Evaluation.objects.filter(gate__pilot=other).count() == 1
    assert not NodeLease.objects.filter(job__in=[job, second]).exists(), explain(second, cluster)
    text = "".join(second.chunks.values_list("text", flat=True))
    assert "its nodes are free now: the run starts" in text
