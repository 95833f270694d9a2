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
    assert f"run {str(job_a.code)[:8]} of pilot Pilot A" in str(refused.value) and "10.0.0.2:22" in str(refused.value)
    assert not NodeLease.objects.filter(job=job_b).exists()  # all or nothing
    assert lease_holder(nodes_b[1]) == job_a and lease_holder(nodes_b[0]) is None
    release_nodes(job_a)
    take_nodes(job_b, nodes_b)
    assert lease_holder(nodes_a[1]) == job_b


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
