"""Two pilots on the same machines: the second run is refused naming the first; neither verdict changes."""
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


def test_a_second_pilot_on_the_same_nodes_is_refused_and_the_first_verdict_stands(cluster, sim_site):
    cluster.worker("all", [cluster.control, sim_site.site.queue], concurrency=3)
    job = start_gate_run(sim_site.pilot.gate(1), sim_site.people.alice, site=sim_site.site, params=FAST_RUN)
    assert NodeLease.objects.filter(job=job).count() >= 2

    other, other_site = _second_pilot_on_the_same_machines(sim_site, sim_site.people)
    with pytest.raises(RunRefused) as refused:
        start_gate_run(other.gate(1), sim_site.people.alice, site=other_site, params=FAST_RUN)
    message = str(refused.value)
    assert f"in use by G1 run {str(job.code)[:8]} of pilot {sim_site.pilot.name}" in message, message

    job = wait_for(job, 240)
    evaluation = assert_judged(job, cluster)
    assert not Evaluation.objects.filter(gate__pilot=other).exists() and not other.jobs.exists()
    assert other.gate(1).state == Gate.State.OPEN
    assert Gate.objects.get(pk=sim_site.pilot.gate(1).pk).verdict == evaluation.verdict
    assert not NodeLease.objects.filter(job=job).exists(), explain(job, cluster)
    # Free again: pilot B's run may now start (and is canceled at once: the point is that it starts).
    from runners.orchestration import request_cancel

    second = start_gate_run(other.gate(1), sim_site.people.alice, site=other_site, params=FAST_RUN)
    assert NodeLease.objects.filter(job=second).exists()
    request_cancel(second)
    assert wait_for(second, 120).status == Status.CANCELED
