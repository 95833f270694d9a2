"""A step retried after an unfinished attempt keeps that attempt's files: set aside, listed, never judged."""
from __future__ import annotations

import pytest
from django.db import transaction

from runners import engine
from runners.artifacts import read_artifact, store_bytes
from runners.evaluation import JUDGED_KINDS
from runners.gateplans import StepList
from runners.models import Artifact, Job

pytestmark = pytest.mark.django_db


def test_a_retry_sets_the_earlier_attempts_files_aside_and_stores_its_own_under_the_same_names(signed_pilot,
                                                                                               local_site):
    site, nodes = local_site
    with transaction.atomic():
        job = Job.objects.create(pilot=signed_pilot.pilot, gate=signed_pilot.pilot.gate(1), site=site, params={})
        steps = StepList(job)
        steps.add("t_note", node=nodes[0])
        steps.save()
    step = job.steps.get()
    kind = next(iter(JUDGED_KINDS))
    store_bytes(job, "node1/records/measure.jsonl", b'{"i": 1}\n', kind=kind, step=step, node=nodes[0])
    store_bytes(job, "node1/server.log", b"attempt one's log\n", kind="server-log", step=step, node=nodes[0])

    step.attempts = 2
    engine._set_aside_earlier_attempt(job, step)
    # The new attempt stores different bytes under the same names: no clash with the first attempt's.
    store_bytes(job, "node1/records/measure.jsonl", b'{"i": 2}\n', kind=kind, step=step, node=nodes[0])
    step.attempts = 3
    engine._set_aside_earlier_attempt(job, step)

    rows = {a.name: a for a in Artifact.objects.filter(job=job)}
    assert set(rows) == {"attempt-1/node1/records/measure.jsonl", "attempt-1/node1/server.log",
                         "attempt-2/node1/records/measure.jsonl"}
    assert {a.outcome for a in rows.values()} == {engine.SUPERSEDED}
    assert read_artifact(rows["attempt-1/node1/server.log"]) == b"attempt one's log\n"
    assert read_artifact(rows["attempt-2/node1/records/measure.jsonl"]) == b'{"i": 2}\n'
    # The judge reads only a finished attempt's files.
    assert not job.artifacts.filter(kind__in=JUDGED_KINDS, outcome="").exists()
