"""The number of database queries of each page does not grow with the number of pilots, runs or records."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from gates import lifecycle
from gates.models import Pilot
from runners import artifacts, output
from runners.models import Job, Node, Status, Step


def queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(captured)


def add_pilots(world, count: int) -> None:
    for n in range(count):
        pilot = lifecycle.create_pilot(
            name=f"Extra pilot {n}", customer=world.pilot.customer, vendor=world.pilot.vendor, who="test"
        )
        if n % 2:
            lifecycle.sign_plan(pilot.latest_plan, world.alice)


def add_runs(world, count: int) -> None:
    for _n in range(count):
        job = Job.objects.create(pilot=world.pilot, gate=world.gate, site=world.site, created_by=world.alice)
        Step.objects.create(job=job, seq=1, name="probe", node=world.node, status=Status.SUCCESSFUL)


def add_records(world, count: int) -> None:
    for n in range(count):
        step = Step.objects.create(job=world.job, seq=100 + n, name="measure", node=world.node, requests_total=10)
        output.append_output(world.job, f"line {n}\n", step=step)
        artifacts.store_bytes(
            world.job, f"node1/records-{n}.jsonl", f"{n}".encode(), kind="records", step=step, node=world.node
        )
        Node.objects.create(site=world.site, name=f"node-extra-{n}", host="127.0.0.1", username="fx")
        lifecycle.audit(world.pilot, world.alice, "site.created", world.pilot, n=n)


def test_the_home_page_costs_the_same_for_3_and_23_pilots(client, world):
    add_pilots(world, 2)  # one of each kind first: empty lists cost no query, so start with none empty
    client.force_login(world.alice)
    before = queries(client, reverse("home"))
    add_pilots(world, 20)
    assert queries(client, reverse("home")) == before


def test_pilot_and_gate_pages_cost_the_same_for_1_and_21_runs(client, world):
    client.force_login(world.alice)
    urls = [reverse("pilot", args=[world.pilot.code]), reverse("gate", args=[world.pilot.code, 1])]
    before = [queries(client, url) for url in urls]
    add_runs(world, 20)
    assert [queries(client, url) for url in urls] == before


def test_run_sites_node_and_audit_pages_cost_the_same_for_1_and_21_records(client, world):
    client.force_login(world.alice)
    urls = [
        reverse("run", args=[world.job.code]),
        reverse("run_log", args=[world.job.code]) + "?after=0",
        reverse("sites", args=[world.pilot.code]),
        reverse("audit", args=[world.pilot.code]),
        reverse("node", args=[world.node.code]),
        reverse("plan", args=[world.pilot.code]),
    ]
    before = [queries(client, url) for url in urls]
    add_records(world, 20)
    assert [queries(client, url) for url in urls] == before


def test_the_home_page_stays_within_a_small_fixed_number_of_queries(client, world):
    add_pilots(world, 5)
    client.force_login(world.alice)
    assert queries(client, reverse("home")) <= 15
    assert Pilot.objects.count() == 6
