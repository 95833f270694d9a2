"""Every view for every role: members see their pilot, a role that may not act gets 403 and is not
offered the action, a person of another customer gets 404 — pages, downloads and POSTs alike."""

from __future__ import annotations

import pytest
from django.urls import reverse

MEMBERS = ["alice", "erin", "bob", "carol", "dave"]
SIGNERS = {"alice", "erin", "bob"}
OPERATORS = {"alice"}
RAW = {"alice", "erin", "bob", "carol"}

# name, method, url arguments from the world, who may (the other members get 403), POST data
ROUTES = [
    ("pilot", "get", lambda w: [w.pilot.code], set(MEMBERS), None),
    ("plan", "get", lambda w: [w.pilot.code], set(MEMBERS), None),
    ("gate", "get", lambda w: [w.pilot.code, 1], set(MEMBERS), None),
    ("reports", "get", lambda w: [w.pilot.code], set(MEMBERS), None),
    ("audit", "get", lambda w: [w.pilot.code], set(MEMBERS), None),
    ("sites", "get", lambda w: [w.pilot.code], set(MEMBERS), None),
    ("node", "get", lambda w: [w.node.code], set(MEMBERS), None),
    ("run", "get", lambda w: [w.job.code], set(MEMBERS), None),
    ("run_log", "get", lambda w: [w.job.code], set(MEMBERS), None),
    ("report_download", "get", lambda w: [w.report.code], RAW, None),  # a report attaches the raw data
    ("report_check", "get", lambda w: [w.report.code], set(MEMBERS), None),
    ("artifact_download", "get", lambda w: [w.artifact.code], RAW, None),
    (
        "criterion_edit",
        "post",
        lambda w: [w.pilot.code, "g1-gpu-count"],
        SIGNERS,
        {"g1-gpu-count-op": ">=", "g1-gpu-count-threshold": "7", "g1-gpu-count-confidence": "95"},
    ),
    ("plan_sign", "post", lambda w: [w.pilot.code], SIGNERS, {"comment": ""}),
    ("plan_amend", "post", lambda w: [w.pilot.code], SIGNERS, {}),
    ("plan_sample_trace", "post", lambda w: [w.pilot.code], SIGNERS, {"sample_trace": "allowed"}),
    ("gate_signoff", "post", lambda w: [w.pilot.code, 1], SIGNERS, {"decision": "approve", "comment": "ok"}),
    ("gate_extend", "post", lambda w: [w.pilot.code, 1], SIGNERS, {}),
    ("run_start", "post", lambda w: [w.pilot.code, 1], OPERATORS, {}),
    ("run_cancel", "post", lambda w: [w.job.code], OPERATORS, {}),
    ("site_create", "post", lambda w: [w.pilot.code], OPERATORS, {"name": "Second", "queue": "second"}),
    ("node_create", "post", lambda w: [w.site.code], OPERATORS, {}),
    ("credential_create", "post", lambda w: [w.site.code], OPERATORS, {}),
    ("node_contact", "post", lambda w: [w.node.code], OPERATORS, {}),
    ("node_accept_host_key", "post", lambda w: [w.node.code], OPERATORS, {"fingerprint": "SHA256:examplefingerprint"}),
]
CASES = [(route, person) for route in ROUTES for person in [*MEMBERS, "charlie"]]


def _login(client, world, person: str):
    client.force_login(getattr(world, person))


@pytest.mark.parametrize("route,person", CASES, ids=[f"{r[0]}-{p}" for r, p in CASES])
def test_each_person_gets_what_their_role_allows_and_nothing_else(client, world, route, person):
    name, method, args, allowed, data = route
    _login(client, world, person)
    url = reverse(name, args=args(world))
    response = client.get(url) if method == "get" else client.post(url, data or {})
    if person == "charlie":
        assert response.status_code == 404
    elif person in allowed:
        assert response.status_code == (200 if method == "get" else 302), response.content[:500]
    else:
        assert response.status_code == 403


def test_an_anonymous_visitor_is_sent_to_log_in(client, world):
    response = client.get(reverse("pilot", args=[world.pilot.code]))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_the_home_page_lists_only_the_persons_own_pilots(client, world):
    client.force_login(world.charlie)
    page = client.get(reverse("home")).content.decode()
    assert world.pilot.name not in page
    client.force_login(world.carol)
    assert world.pilot.name in client.get(reverse("home")).content.decode()


def _page(client, world, person: str, name: str, *args) -> str:
    _login(client, world, person)
    return client.get(reverse(name, args=list(args))).content.decode()


def test_only_the_vendor_engineer_is_offered_sites_nodes_credentials_and_host_keys(client, world):
    for person in ("erin", "bob", "carol", "dave"):
        page = _page(client, world, person, "sites", world.pilot.code)
        assert reverse("site_create", args=[world.pilot.code]) not in page
        assert reverse("credential_create", args=[world.site.code]) not in page
        assert reverse("node_accept_host_key", args=[world.node.code]) not in page
    page = _page(client, world, "alice", "sites", world.pilot.code)
    assert reverse("site_create", args=[world.pilot.code]) in page
    assert reverse("node_accept_host_key", args=[world.node.code]) in page


def test_only_signers_are_offered_the_gate_sign_off(client, world):
    for person in ("carol", "dave"):
        assert reverse("gate_signoff", args=[world.pilot.code, 1]) not in _page(
            client, world, person, "gate", world.pilot.code, 1
        )
    for person in ("erin", "bob"):
        assert reverse("gate_signoff", args=[world.pilot.code, 1]) in _page(
            client, world, person, "gate", world.pilot.code, 1
        )


def test_a_viewer_sees_artifacts_without_a_download_link(client, world):
    link = reverse("artifact_download", args=[world.artifact.code])
    assert link not in _page(client, world, "dave", "run", world.job.code)
    assert link in _page(client, world, "carol", "run", world.job.code)


def test_the_plan_is_editable_only_by_plan_editors_and_only_before_a_signature(client, demo):
    from gates.models import Role
    from tests.portal.conftest import add_person

    add_person("dave", demo.pilot.customer, Role.VIEWER)
    edit = reverse("criterion_edit", args=[demo.pilot.code, "g1-gpu-count"])
    client.force_login(demo.carol)
    assert edit not in client.get(reverse("plan", args=[demo.pilot.code])).content.decode()
    client.force_login(demo.bob)
    assert edit in client.get(reverse("plan", args=[demo.pilot.code])).content.decode()


@pytest.mark.parametrize("person", [*MEMBERS, "charlie"])
def test_the_pages_without_an_id_open_for_everyone_signed_in(client, world, person):
    _login(client, world, person)
    for name in ("home", "report_verify"):
        assert client.get(reverse(name)).status_code == 200
