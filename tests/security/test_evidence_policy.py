"""The documented policy (docs/portal.md, "Who sees what"), for every role × download × face.

Faces: the portal (a signed-in session) and the API (a Bearer token). Downloads: a raw artifact and a
signed report (which attaches the raw data). Members with raw-data access get the bytes and their hash,
a viewer gets 403, a person of another organisation 404 — the same answer in both faces.
"""
from __future__ import annotations

import hashlib

import pytest
from django.test import Client
from django.urls import reverse

from gates.models import ApiToken, Report

RAW = {"alice": "vendor engineer + lead", "erin": "vendor lead", "bob": "customer approver", "carol": "customer engineer"}
PEOPLE = [*RAW, "dave", "charlie"]
EXPECTED = {**{name: 200 for name in RAW}, "dave": 403, "charlie": 404}


@pytest.fixture
def evidence(world, settings):
    """The world with a report whose stored bytes hash to what its row says."""
    from runners.artifacts import put_bytes

    data = b"%PDF-1.7\n% a report that attaches raw data\n"
    sha256 = hashlib.sha256(data).hexdigest()
    name = f"reports/{world.pilot.code}/policy.pdf"
    put_bytes(name, data, sha256)
    world.report = Report.objects.create(pilot=world.pilot, gate=world.gate, evaluation=world.evaluation,
                                         kind=Report.Kind.GATE, path=name, sha256=sha256, size=len(data), simulated=True)
    world.report_bytes = data
    world.artifact_bytes = b'{"gpus": 8}'
    return world


def _portal(world, person: str, what: str):
    client = Client()
    client.force_login(getattr(world, person))
    if what == "artifact":
        return client.get(reverse("artifact_download", args=[world.artifact.code]))
    return client.get(reverse("report_download", args=[world.report.code]))


def _api(world, person: str, what: str):
    _token, key = ApiToken.issue(getattr(world, person), "policy test")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    if what == "artifact":
        return client.get(f"/api/v1/artifacts/{world.artifact.code}/download")
    return client.get(f"/api/v1/reports/{world.report.code}/download")


FACES = {"portal": _portal, "api": _api}
CASES = [(person, what, face) for person in PEOPLE for what in ("artifact", "report") for face in FACES]


@pytest.mark.parametrize(("person", "what", "face"), CASES, ids=[f"{p}-{w}-{f}" for p, w, f in CASES])
def test_every_role_gets_the_documented_answer_on_every_download_in_both_faces(evidence, person, what, face):
    response = FACES[face](evidence, person, what)
    assert response.status_code == EXPECTED[person], (person, what, face, response.status_code)
    if response.status_code == 200:
        expected = evidence.artifact_bytes if what == "artifact" else evidence.report_bytes
        assert b"".join(response.streaming_content) == expected
        assert response["X-Content-SHA256"] == hashlib.sha256(expected).hexdigest()
        assert response["X-Content-Type-Options"] == "nosniff" and "attachment" in response["Content-Disposition"]
        assert response["Content-Type"] == ("application/pdf" if what == "report" else "application/octet-stream")
    elif face == "api":
        assert response["Content-Type"] == "application/json" and response.json()["error"]


def test_a_viewers_token_gets_403_on_raw_data_but_sees_the_verdicts_and_the_lists(evidence):
    _token, key = ApiToken.issue(evidence.dave, "viewer")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    refused = api.get(f"/api/v1/artifacts/{evidence.artifact.code}/download")
    assert refused.status_code == 403 and "raw data" in refused.json()["error"]
    assert api.get(f"/api/v1/pilots/{evidence.pilot.code}/gates/1/verdicts").status_code == 200
    listed = api.get(f"/api/v1/runs/{evidence.job.code}/artifacts").json()["artifacts"]
    assert [a["sha256"] for a in listed] == [evidence.artifact.sha256]
    reports = api.get(f"/api/v1/pilots/{evidence.pilot.code}/reports").json()["reports"]
    assert evidence.report.sha256 in {r["sha256"] for r in reports}


def test_a_stored_file_that_no_longer_matches_its_hash_is_not_served(evidence):
    Report.objects.filter(pk=evidence.report.pk).update(sha256="0" * 64)
    for face in FACES.values():
        assert face(evidence, "alice", "report").status_code == 404


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "reports/../../x", "reports\\..\\x"])
def test_a_stored_name_that_leaves_the_evidence_store_is_not_served(evidence, path):
    Report.objects.filter(pk=evidence.report.pk).update(path=path)
    for face in FACES.values():
        assert face(evidence, "alice", "report").status_code == 404


def test_the_capability_travels_with_the_query(evidence):
    from gates.models import Pilot
    from portal.access import RAW_DATA, VIEW
    from runners.models import Artifact, Job

    for person in PEOPLE:
        user = getattr(evidence, person)
        raw = person in RAW
        assert Artifact.objects.for_user(user, may=RAW_DATA).filter(pk=evidence.artifact.pk).exists() == raw
        assert Report.objects.for_user(user, may=RAW_DATA).filter(pk=evidence.report.pk).exists() == raw
        assert Job.objects.for_user(user, may=VIEW).filter(pk=evidence.job.pk).exists() == (person != "charlie")
        assert Pilot.objects.for_user(user, may=RAW_DATA).filter(pk=evidence.pilot.pk).exists() == raw
