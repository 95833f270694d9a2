"""G4's permission to replay a generated sample trace is a value of the plan: hashed, signed, frozen, audited.

G4 starts without the customer's trace only when the plan *both parties signed* allows the sample.
"""
from __future__ import annotations

import importlib
import json
from types import SimpleNamespace

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

from gates import lifecycle
from gates.models import AuditEvent, PlanVersion
from gates.plan import PlanError, load_plan, validate_plan
from runners import traces
from runners.models import Job, Node, Site
from runners.orchestration import RunRefused, start_gate_run
from tests.orchestration.conftest import open_gate
from tests.security.test_frozen_plan import without_guards  # noqa: F401 — a fixture

migration = importlib.import_module("gates.migrations.0008_sample_trace_is_signed")


def _document(sample):
    plan = load_plan("default")
    data = plan.to_dict()
    data["gates"] = list(data["gates"])
    for gate in data["gates"]:
        gate["weeks"], gate["arms"] = list(gate["weeks"]), list(gate["arms"])
        gate["criteria"] = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in c.items() if v is not None}
                            for c in gate["criteria"]]
        if gate["number"] == 4 and sample is not None:
            gate["sample_trace"] = sample
    return data


def test_a_plan_allowing_the_sample_hashes_differently_from_one_that_does_not():
    default = load_plan("default")
    refused, allowed = validate_plan(_document(None)), validate_plan(_document("allowed"))
    assert refused.sha256 == default.sha256  # a plan that says nothing hashes as it always did
    assert not refused.gate(4).sample_trace and allowed.gate(4).sample_trace
    assert allowed.sha256 != refused.sha256
    assert validate_plan(_document(True)).sha256 == allowed.sha256
    assert validate_plan(_document("refused")).sha256 == refused.sha256
    assert '"sample_trace":true' in allowed.canonical_json()


def test_a_bad_sample_trace_value_is_refused_naming_the_gate_and_field():
    with pytest.raises(PlanError, match=r"G4 › sample_trace: 'perhaps' must be allowed or refused"):
        validate_plan(_document("perhaps"))
    data = _document(None)
    data["gates"][2]["sample_trace"] = "allowed"
    with pytest.raises(PlanError, match="G3 › sample_trace: only G4 replays a trace"):
        validate_plan(data)


def test_the_permission_is_signed_with_the_plan_and_frozen_with_it(demo):
    version = demo.pilot.latest_plan
    before = version.to_plan().sha256
    lifecycle.set_sample_trace(version, True, demo.alice)
    version.refresh_from_db()
    assert version.to_plan().sha256 != before
    event = AuditEvent.objects.get(action="plan.sample_trace", object_id=str(version.pk))
    assert event.actor == demo.alice and event.detail["after"] == {"sample_trace": True}
    signoff = lifecycle.sign_plan(version, demo.alice)
    assert signoff.evidence_sha256 == version.to_plan().sha256
    with pytest.raises(lifecycle.TransitionRefused, match="already been approved by one party"):
        lifecycle.set_sample_trace(version, False, demo.bob)
    lifecycle.sign_plan(version, demo.bob)
    version.refresh_from_db()
    with pytest.raises(lifecycle.TransitionRefused, match="signed and frozen"):
        traces.allow_sample(version, demo.alice, allowed=False)
    assert version.verified_plan().gate(4).sample_trace
    assert traces.trace_for_run(demo.pilot.gate(4)) == (None, None)
    with pytest.raises(lifecycle.TransitionRefused, match="plan-editor-role"):
        lifecycle.set_sample_trace(lifecycle.amend_plan(demo.pilot, demo.alice), False, demo.charlie)


@pytest.fixture
def g4_site(signed_pilot):
    site = Site.objects.create(pilot=signed_pilot.pilot, name="site1", queue="q-site1")
    Node.objects.create(site=site, name="node1", host="127.0.0.1", username="fxpilot", simulated=True)
    open_gate(signed_pilot.pilot, 4, signed_pilot)
    return site


def test_a_draft_that_allows_the_sample_does_not_let_g4_start_until_both_sign_it(signed_pilot, g4_site):
    pilot = signed_pilot.pilot
    draft = lifecycle.amend_plan(pilot, signed_pilot.alice)
    traces.allow_sample(draft, signed_pilot.alice)
    with pytest.raises(RunRefused, match="the signed plan does not allow a generated sample trace"):
        start_gate_run(pilot.gate(4), signed_pilot.alice, site=g4_site)
    assert not Job.objects.exists()
    lifecycle.sign_plan(draft, signed_pilot.alice)
    lifecycle.sign_plan(draft, signed_pilot.bob)
    job = start_gate_run(pilot.gate(4), signed_pilot.alice, site=g4_site)
    assert job.artifacts.get(kind="trace").name == "sample-trace.csv"


def test_a_permission_written_behind_the_signatures_is_refused_by_the_hash(signed_pilot, g4_site, without_guards):  # noqa: F811
    version = signed_pilot.pilot.signed_plan
    document = version.document
    for item in document["gates"]:
        if item["number"] == 4:
            item["sample_trace"] = True
    with connection.cursor() as cursor:
        cursor.execute("UPDATE gates_planversion SET document = %s WHERE id = %s",
                       [json.dumps(document), version.pk])
    with pytest.raises(RunRefused, match="changed after signing"):
        start_gate_run(signed_pilot.pilot.gate(4), signed_pilot.alice, site=g4_site)
    assert not Job.objects.exists()


def test_the_plan_page_shows_the_permission_and_changes_it_only_while_editable(demo, client):
    pilot = demo.pilot
    client.force_login(demo.alice)
    page = client.get(reverse("plan", args=[pilot.code])).content.decode()
    assert "G4 will not start until the customer's session trace is uploaded" in page
    assert 'name="sample_trace"' in page
    client.post(reverse("plan_sample_trace", args=[pilot.code]), {"sample_trace": "allowed"})
    page = client.get(reverse("plan", args=[pilot.code])).content.decode()
    assert "A generated sample trace is allowed." in page and "generated sample trace allowed" in page
    lifecycle.sign_plan(pilot.latest_plan, demo.alice)
    lifecycle.sign_plan(pilot.latest_plan, demo.bob)
    page = client.post(reverse("plan_sample_trace", args=[pilot.code]), {"sample_trace": "refused"},
                       follow=True).content.decode()
    assert "signed and frozen" in page and 'name="sample_trace"' not in page
    assert pilot.signed_plan.verified_plan().gate(4).sample_trace
    client.force_login(demo.charlie)
    assert client.post(reverse("plan_sample_trace", args=[pilot.code]), {"sample_trace": "refused"}).status_code == 404


def _migrate():
    apps = MigrationExecutor(connection).loader.project_state(("gates", "0008_sample_trace_is_signed")).apps
    with connection.cursor() as cursor:
        migration.forward(apps, SimpleNamespace(connection=connection, execute=lambda sql, params=None: cursor.execute(sql)))


def _raw_allow(version):
    document = version.document
    for item in document["gates"]:
        if item["number"] == 4:
            item["sample_trace"] = "allowed"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE gates_planversion SET document = %s WHERE id = %s",
                       [json.dumps(document), version.pk])


def test_the_migration_takes_an_unsigned_permission_out_of_a_signed_plan_and_keeps_it_in_a_fresh_draft(
        signed_pilot, without_guards):  # noqa: F811
    signed = signed_pilot.pilot.signed_plan
    _raw_allow(signed)  # what the previous release wrote: outside the hash both parties signed
    draft = lifecycle.amend_plan(signed_pilot.pilot, signed_pilot.alice)
    _raw_allow(draft)
    _migrate()
    signed, draft = PlanVersion.objects.get(pk=signed.pk), PlanVersion.objects.get(pk=draft.pk)
    assert not signed.verified_plan().gate(4).sample_trace  # exactly what was signed, hash intact
    event = AuditEvent.objects.get(action="plan.sample_trace_unsigned", object_id=str(signed.pk))
    assert "amend the plan" in event.detail["reason"]
    assert draft.to_plan().gate(4).sample_trace and [g.get("sample_trace") for g in draft.document["gates"]][3] is True
    assert not AuditEvent.objects.filter(action="plan.sample_trace_unsigned", object_id=str(draft.pk)).exists()
    # The freeze guards are back.
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE gates_planversion SET document = '{}' WHERE id = %s", [signed.pk])
    with connection.cursor() as cursor:  # the fixture puts them back again at the end
        for statement in (migration.guards.SQLITE_DROP if connection.vendor == "sqlite"
                          else migration.guards.POSTGRESQL_DROP):
            cursor.execute(statement)
