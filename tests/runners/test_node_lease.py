"""A machine belongs to one run at a time, whichever pilot registered it."""
from __future__ import annotations

import uuid

import pytest

from runners.models import Job, LeaseRefused, Node, NodeLease, Site, Status, lease_holder, release_nodes, take_nodes

pytestmark = pytest.mark.django_db


def _pilot(name: str):
    from gates.models import Organisation, Pilot

    vendor = Organisation.objects.create(name=f"Vendor {name}", kind=Organisation.Kind.VENDOR)
    customer = Organisation.objects.create(name=f"Customer {name}", kind=Organisation.Kind.CUSTOMER)
    return Pilot.objects.create(name=f"Pilot {name}", vendor=vendor, customer=customer)


def _nodes(pilot, *, fingerprint: str = "", hosts=("10.0.0.1", "10.0.0.2")) -> list[Node]:
    site = Site.objects.create(pilot=pilot, name="lab", queue=f"site-{uuid.uuid4().hex[:8]}")
    state = Node.HostKeyState.ACCEPTED if fingerprint else Node.HostKeyState.UNKNOWN
    return [Node.objects.create(site=site, name=f"node{i}", host=host, port=22, username="fx", host_key_state=state,
                                host_key_fingerprint=f"{fingerprint}{i}" if fingerprint else "")
            for i, host in enumerate(hosts, 1)]


def test_a_second_pilot_on_the_same_machines_is_refused_naming_the_run_that_holds_them():
    a, b = _pilot("A"), _pilot("B")
    nodes_a, nodes_b = _nodes(a), _nodes(b, hosts=("10.0.0.9", "10.0.0.2"))
    job_a = Job.objects.create(pilot=a, status=Status.RUNNING)
    job_b = Job.objects.create(pilot=b)
    take_nodes(job_a, nodes_a)
    with pytest.raises(LeaseRefused) as refused:
        take_nodes(job_b, nodes_b)
    assert refused.value.holder == job_a
    # Pilot B's people (another customer) are not told pilot A's name or its run's code.
    assert "in use by a run of another pilot" in str(refused.value) and "10.0.0.2:22" in str(refused.value)
    assert "Pilot A" not in str(refused.value) and str(job_a.code)[:8] not in str(refused.value)
    assert not NodeLease.objects.filter(job=job_b).exists()  # all or nothing
    assert lease_holder(nodes_b[1]) == job_a and lease_holder(nodes_b[0]) is None
    release_nodes(job_a)
    take_nodes(job_b, nodes_b)
    assert lease_holder(nodes_a[1]) == job_b


def test_a_run_of_a_pilot_with_the_same_parties_is_named():
    a = _pilot("G")
    b = type(a).objects.create(name="Pilot G2", vendor=a.vendor, customer=a.customer)
    job_a = Job.objects.create(pilot=a, status=Status.RUNNING)
    take_nodes(job_a, _nodes(a))
    with pytest.raises(LeaseRefused) as refused:
        take_nodes(Job.objects.create(pilot=b), _nodes(b))
    assert f"run {str(job_a.code)[:8]} of pilot Pilot G" in str(refused.value)


def test_the_same_host_key_behind_another_address_is_the_same_machine():
    a, b = _pilot("C"), _pilot("D")
    job_a = Job.objects.create(pilot=a, status=Status.RUNNING)
    take_nodes(job_a, _nodes(a, fingerprint="SHA256:same"))
    with pytest.raises(LeaseRefused):
        take_nodes(Job.objects.create(pilot=b), _nodes(b, fingerprint="SHA256:same", hosts=("gpu1.lab", "gpu2.lab")))


def test_a_lease_whose_run_finished_is_free_and_taking_again_is_idempotent():
    a, b = _pilot("E"), _pilot("F")
    nodes = _nodes(a)
    job_a = Job.objects.create(pilot=a, status=Status.RUNNING)
    take_nodes(job_a, nodes)
    take_nodes(job_a, nodes)
    assert NodeLease.objects.filter(job=job_a).count() == 2
    Job.objects.filter(pk=job_a.pk).update(status=Status.ERROR)
    job_b = Job.objects.create(pilot=b)
    take_nodes(job_b, _nodes(b))
    assert set(NodeLease.objects.values_list("job", flat=True)) == {job_b.pk}


# ── A run that waits for its nodes ─────────────────────────────────────────────────────────────


def _holder_and_waiter(signed_pilot):
    """Pilot A's run holds two machines; the demo pilot's G1 is started on the same machines and waits."""
    from runners.orchestration import RunRefused, start_gate_run

    a = _pilot("Holder")
    job_a = Job.objects.create(pilot=a, kind=Job.Kind.PROBE, status=Status.RUNNING)
    take_nodes(job_a, _nodes(a))
    pilot = signed_pilot.pilot
    site = Site.objects.create(pilot=pilot, name="same machines", queue=f"site-{uuid.uuid4().hex[:8]}")
    for i, host in enumerate(("10.0.0.1", "10.0.0.2"), 1):
        Node.objects.create(site=site, name=f"gpu{i}", host=host, port=22, username="fx", simulated=True)
    with pytest.raises(RunRefused) as refused:
        start_gate_run(pilot.gate(1), signed_pilot.alice, site=site, wait=False)
    assert "in use by a run of another pilot" in str(refused.value) and "Pilot Holder" not in str(refused.value)
    assert not Job.objects.filter(pilot=pilot).exists()
    job_b = start_gate_run(pilot.gate(1), signed_pilot.alice, site=site)
    return job_a, job_b


def _log(job: Job) -> str:
    return "".join(job.chunks.values_list("text", flat=True))


def test_a_run_started_on_held_nodes_waits_naming_the_node_and_the_run_then_starts_when_they_are_given_back(
        signed_pilot, django_capture_on_commit_callbacks):
    from runners import engine

    job_a, job_b = _holder_and_waiter(signed_pilot)
    waiting = "waiting for node gpu1 (10.0.0.1:22) held by a run of another pilot"
    assert job_b.status == Status.PENDING and job_b.waiting_on == job_a and job_b.waiting_for.startswith(waiting)
    assert _log(job_b).count(waiting) == 1
    assert not NodeLease.objects.filter(job=job_b).exists()

    # The run's page says it too, in English and in Chinese, without naming the other customer's pilot or run.
    from django.test import Client
    from django.urls import reverse

    client = Client()
    client.force_login(signed_pilot.alice)
    page = client.get(reverse("run", args=[job_b.code])).content.decode()
    assert "Waiting for node gpu1, in use by a run of another pilot." in page, page
    assert "Pilot Holder" not in page and str(job_a.code)[:8] not in page
    client.post(reverse("set_language"), {"language": "zh-hans"})
    assert "正在等待节点 gpu1，它正被另一个试点的运行占用" in client.get(reverse("run", args=[job_b.code])).content.decode()
    from django.utils import translation

    translation.activate("en")

    # Looking again while the nodes are held (the sweep does, every few seconds) dispatches nothing, says nothing new.
    engine.advance(job_b.pk)
    assert not job_b.steps.exclude(heartbeat=None).exists() and _log(job_b).count(waiting) == 1

    # The holder ends: its close gives the machines back and wakes the waiting run once that commits.
    job_a.steps.create(seq=1, name="evaluate", status=Status.SUCCESSFUL)
    with django_capture_on_commit_callbacks(execute=False) as woken:
        engine.advance(job_a.pk)
    job_a.refresh_from_db()
    assert job_a.status == Status.SUCCESSFUL and not NodeLease.objects.filter(job=job_a).exists()
    assert len(woken) == 1

    engine.advance(job_b.pk)
    job_b.refresh_from_db()
    assert (job_b.waiting_for, job_b.waiting_on) == ("", None)
    assert NodeLease.objects.filter(job=job_b).count() == 2
    assert "its nodes are free now: the run starts" in _log(job_b)
    assert job_b.steps.exclude(heartbeat=None).exists()  # its first steps were dispatched


def test_a_waiting_run_that_is_canceled_ends_canceled_without_taking_the_nodes(signed_pilot):
    from runners import engine
    from runners.orchestration import request_cancel

    job_a, job_b = _holder_and_waiter(signed_pilot)
    request_cancel(job_b)
    engine.advance(job_b.pk)
    job_b.refresh_from_db()
    assert job_b.status == Status.CANCELED and not job_b.waiting_for
    assert set(job_b.steps.values_list("status", flat=True)) == {Status.CANCELED}
    assert not NodeLease.objects.filter(job=job_b).exists() and lease_holder(job_b.steps.exclude(node=None)
                                                                             .first().node) == job_a
