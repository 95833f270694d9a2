"""Frozen means frozen: a signed plan version and its criteria refuse change by the ORM, raw SQL, a
migration's historical models and the admin; a plan changed behind all of them is refused by its hash."""
from __future__ import annotations

import importlib

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from gates import lifecycle
from gates.models import Criterion, PlanFrozenError, PlanTamperedError, PlanVersion

guards = importlib.import_module("gates.migrations.0005_plan_freeze_guards")


@pytest.fixture
def signed(signed_pilot):
    version = signed_pilot.pilot.signed_plan
    signed_pilot.version = version
    signed_pilot.criterion = version.criteria.get(key="g3-speedup-recompute")
    return signed_pilot


def test_a_signed_threshold_cannot_be_changed_through_the_orm(signed):
    criterion = signed.criterion
    assert criterion.threshold == 8.6
    criterion.threshold = 0.001
    with pytest.raises(PlanFrozenError, match="g3-speedup-recompute.*signed and frozen"):
        criterion.save()
    with pytest.raises(PlanFrozenError, match="changing threshold"):
        Criterion.objects.filter(pk=criterion.pk).update(threshold=0.001)
    with pytest.raises(PlanFrozenError), transaction.atomic():
        Criterion.objects.bulk_update([criterion], ["threshold"])
    with pytest.raises(PlanFrozenError, match="deleting"):
        criterion.delete()
    with pytest.raises(PlanFrozenError, match="deleting"):
        Criterion.objects.filter(plan_version=signed.version).delete()
    with pytest.raises(PlanFrozenError, match="adding"):
        Criterion.objects.create(plan_version=signed.version, gate_number=3, key="extra", description="x",
                                 metric="ttft", statistic="p50", comparison="absolute", op="<=", threshold=1)
    criterion.refresh_from_db()
    assert criterion.threshold == 8.6


def test_the_signed_version_itself_refuses_change_but_may_be_superseded(signed):
    version = signed.version
    version.document = {**version.document, "judging": {"confidence": 0.5}}
    with pytest.raises(PlanFrozenError, match="document cannot change"):
        version.save()
    with pytest.raises(PlanFrozenError):
        PlanVersion.objects.filter(pk=version.pk).update(sha256="0" * 64)
    with pytest.raises(PlanFrozenError):
        PlanVersion.objects.filter(pk=version.pk).update(state="draft")
    with pytest.raises(PlanFrozenError, match="cannot be deleted"):
        PlanVersion.objects.get(pk=version.pk).delete()
    # The lifecycle's own path still works: amend, sign again, the old version is superseded.
    amended = lifecycle.amend_plan(signed.pilot, signed.alice)
    lifecycle.edit_criterion(amended.criteria.get(key="g3-speedup-recompute"), signed.alice, threshold=8.0)
    lifecycle.sign_plan(amended, signed.alice)
    lifecycle.sign_plan(amended, signed.bob)
    version.refresh_from_db()
    assert version.state == PlanVersion.State.SUPERSEDED
    assert version.criteria.get(key="g3-speedup-recompute").threshold == 8.6


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE gates_criterion SET threshold = 0.001 WHERE id = %(criterion)s",
        "UPDATE gates_criterion SET op = '>' WHERE plan_version_id = %(version)s",
        "UPDATE gates_planversion SET document = '{}' WHERE id = %(version)s",
        "UPDATE gates_planversion SET sha256 = '' WHERE id = %(version)s",
        "UPDATE gates_planversion SET state = 'draft' WHERE id = %(version)s",
        "INSERT INTO gates_criterion (plan_version_id, gate_number, key, description, description_zh, metric, statistic,"
        " comparison, candidate, baseline, phase, concurrency, op, threshold, unit, confidence, position) VALUES"
        " (%(version)s, 3, 'extra', 'x', '', 'ttft', 'p50', 'absolute', '', '', 'measure', '[]', '<=', 1, '', 0.95, 9)",
    ],
)
def test_the_database_refuses_raw_sql_on_a_signed_plan(signed, sql):
    with pytest.raises(IntegrityError, match="signed plan version"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql % {"criterion": signed.criterion.pk, "version": signed.version.pk})
    signed.criterion.refresh_from_db()
    assert signed.criterion.threshold == 8.6


@pytest.mark.parametrize("sql", [
    "DELETE FROM gates_criterion WHERE id = %(criterion)s",
    "DELETE FROM gates_criterion WHERE plan_version_id = %(version)s",
    "DELETE FROM gates_planversion WHERE id = %(version)s",
])
def test_the_database_refuses_deleting_a_signed_criterion_or_version_on_sqlite_too(signed, sql):
    """PostgreSQL by 0005's trigger, SQLite by 0013's (the pilot could never be judged again)."""
    with pytest.raises(IntegrityError, match="signed plan version"), transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute(sql % {"criterion": signed.criterion.pk, "version": signed.version.pk})
    assert Criterion.objects.filter(pk=signed.criterion.pk).exists()


def test_a_data_migration_cannot_delete_a_signed_criterion(signed):
    state = MigrationExecutor(connection).loader.project_state(("gates", "0013_sqlite_refuses_deleting_signed_criteria"))
    HistoricalCriterion = state.apps.get_model("gates", "Criterion")
    with pytest.raises(IntegrityError), transaction.atomic():
        HistoricalCriterion.objects.filter(pk=signed.criterion.pk).delete()
    assert Criterion.objects.filter(pk=signed.criterion.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_emptying_the_database_still_works_with_a_signed_plan(signed):
    """`manage.py flush` (and the test suite between transactional tests) may empty every table, and only it."""
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)
    assert not Criterion.objects.exists() and not PlanVersion.objects.exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM fxpilot_flush_permit") if connection.vendor == "sqlite" else None
        assert connection.vendor != "sqlite" or cursor.fetchone()[0] == 0  # the permit is closed again


def test_a_data_migration_cannot_change_a_signed_threshold(signed):
    """A migration works on historical models, without our save(): the database is what refuses."""
    state = MigrationExecutor(connection).loader.project_state(("gates", "0005_plan_freeze_guards"))
    HistoricalCriterion = state.apps.get_model("gates", "Criterion")
    with pytest.raises(IntegrityError), transaction.atomic():
        HistoricalCriterion.objects.filter(pk=signed.criterion.pk).update(threshold=0.001)


def test_a_draft_plan_stays_editable(demo):
    criterion = demo.pilot.latest_plan.criteria.get(key="g3-speedup-recompute")
    lifecycle.edit_criterion(criterion, demo.alice, threshold=9.0)
    criterion.refresh_from_db()
    assert criterion.threshold == 9.0


@pytest.fixture
def without_guards():
    """Someone with the database owner's rights drops the triggers: the hash check is the last line."""
    vendor = connection.vendor
    drop = guards.SQLITE_DROP if vendor == "sqlite" else guards.POSTGRESQL_DROP
    create = guards.SQLITE if vendor == "sqlite" else guards.POSTGRESQL
    with connection.cursor() as cursor:
        for statement in drop:
            cursor.execute(statement)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for statement in create:
                cursor.execute(statement)


def test_a_plan_changed_behind_every_guard_is_refused_by_its_hash(signed, without_guards):
    assert signed.version.verified_plan().sha256 == signed.version.sha256
    with connection.cursor() as cursor:
        cursor.execute("UPDATE gates_criterion SET threshold = 0.001 WHERE id = %s", [signed.criterion.pk])
    with pytest.raises(PlanTamperedError, match="changed after signing"):
        PlanVersion.objects.get(pk=signed.version.pk).verified_plan()


def test_a_rewritten_signed_hash_does_not_match_what_the_parties_approved(signed, without_guards):
    version = signed.version
    plan = version.to_plan()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE gates_criterion SET threshold = 0.001 WHERE id = %s", [signed.criterion.pk])
        tampered = PlanVersion.objects.get(pk=version.pk).to_plan().sha256
        cursor.execute("UPDATE gates_planversion SET sha256 = %s WHERE id = %s", [tampered, version.pk])
    assert tampered != plan.sha256
    with pytest.raises(PlanTamperedError):
        PlanVersion.objects.get(pk=version.pk).verified_plan()


def test_the_admin_shows_a_signed_plan_read_only_and_a_post_changes_nothing(client, signed):
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "a-long-admin-password")
    client.force_login(admin)
    url = f"/admin/gates/planversion/{signed.version.pk}/change/"
    page = client.get(url).content.decode()
    assert 'name="criteria-0-threshold"' not in page and 'name="document"' not in page
    assert "8.6" in page
    client.post(url, {"criteria-TOTAL_FORMS": "1", "criteria-INITIAL_FORMS": "1", "criteria-0-id": signed.criterion.pk,
                      "criteria-0-threshold": "0.001", "document": "{}"})
    signed.criterion.refresh_from_db()
    assert signed.criterion.threshold == 8.6
    criterion_page = client.get(f"/admin/gates/criterion/{signed.criterion.pk}/change/").content.decode()
    assert 'name="threshold"' not in criterion_page
    assert client.get(f"/admin/gates/planversion/{signed.version.pk}/delete/").status_code == 403


def test_an_evaluation_of_a_tampered_plan_is_refused_and_stores_nothing(signed, without_guards):
    from gates.judge import synthetic
    from gates.models import Evaluation
    from runners.artifacts import store_bytes
    from runners.evaluation import evaluate_job
    from runners.models import Job

    gate = signed.pilot.gate(3)
    job = Job.objects.create(pilot=signed.pilot, gate=gate)
    for name, data in synthetic.gate_inputs(3):
        store_bytes(job, name, data, kind="records" if name.endswith(".jsonl") else "probe", simulated=True)
    honest = evaluate_job(job)
    assert honest.plan_version_id == signed.version.pk
    with connection.cursor() as cursor:
        cursor.execute("UPDATE gates_criterion SET threshold = 0.001 WHERE id = %s", [signed.criterion.pk])
    job.pilot.refresh_from_db()
    with pytest.raises(PlanTamperedError, match="changed after signing"):
        evaluate_job(Job.objects.get(pk=job.pk))
    assert Evaluation.objects.filter(job=job).count() == 1
    from runners.evaluation import replay_evaluation

    with pytest.raises(PlanTamperedError):
        replay_evaluation(honest)
