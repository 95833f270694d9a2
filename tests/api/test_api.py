"""The JSON API answers only with what the person may see, and its schema holds under schemathesis."""
from __future__ import annotations

import hashlib

import pytest
from django.test import Client

from gates.models import ApiToken


@pytest.fixture
def tokens(demo) -> dict[str, str]:
    return {name: ApiToken.issue(getattr(demo, name), "test")[1] for name in ("alice", "bob", "charlie")}


def _get(path: str, token: str | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client().get(path, headers=headers)


def test_it_requires_a_token(demo):
    response = _get("/api/v1/pilots")
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    assert _get("/api/v1/pilots", "fxp_wrong").status_code == 401


def test_a_person_sees_only_their_pilots(demo, tokens):
    assert [p["id"] for p in _get("/api/v1/pilots", tokens["bob"]).json()["pilots"]] == [str(demo.pilot.code)]
    assert _get("/api/v1/pilots", tokens["charlie"]).json()["pilots"] == []


def test_every_pilot_url_answers_404_to_another_customer(signed_pilot, tokens):
    code = signed_pilot.pilot.code
    for path in (f"/api/v1/pilots/{code}", f"/api/v1/pilots/{code}/gates", f"/api/v1/pilots/{code}/gates/1",
                 f"/api/v1/pilots/{code}/gates/1/verdicts", f"/api/v1/pilots/{code}/runs", f"/api/v1/pilots/{code}/reports"):
        assert _get(path, tokens["alice"]).status_code == 200, path
        assert _get(path, tokens["charlie"]).status_code == 404, path


def test_runs_artifacts_and_reports_of_another_customer_answer_404(signed_pilot, tokens, settings):
    from gates.models import Report
    from runners.artifacts import store_bytes
    from runners.models import Job

    demo = signed_pilot
    job = Job.objects.create(pilot=demo.pilot, gate=demo.pilot.gate(1))
    artifact = store_bytes(job, "node1/records.jsonl", b'{"schema":"fxpilot.request/1"}\n', kind="records")
    (settings.DATA_DIR / "reports").mkdir(exist_ok=True)
    (settings.DATA_DIR / "reports" / "r.pdf").write_bytes(b"%PDF-1.7\n")
    report = Report.objects.create(pilot=demo.pilot, kind="gate", path="reports/r.pdf",
                                   sha256=hashlib.sha256(b"%PDF-1.7\n").hexdigest(), size=9)
    urls = [f"/api/v1/runs/{job.code}", f"/api/v1/runs/{job.code}/log", f"/api/v1/runs/{job.code}/artifacts",
            f"/api/v1/artifacts/{artifact.code}/download", f"/api/v1/reports/{report.code}/download"]
    for path in urls:
        assert _get(path, tokens["bob"]).status_code == 200, path
        assert _get(path, tokens["charlie"]).status_code == 404, path
    download = _get(f"/api/v1/artifacts/{artifact.code}/download", tokens["bob"])
    assert download["X-Content-SHA256"] == artifact.sha256
    assert b"".join(download.streaming_content) == b'{"schema":"fxpilot.request/1"}\n'


def test_a_revoked_token_is_refused(demo, tokens):
    ApiToken.objects.filter(user=demo.bob).update(revoked=True)
    assert _get("/api/v1/pilots", tokens["bob"]).status_code == 401


def test_the_log_refuses_a_bad_after(signed_pilot, tokens):
    from runners.models import Job

    job = Job.objects.create(pilot=signed_pilot.pilot, gate=signed_pilot.pilot.gate(1))
    response = _get(f"/api/v1/runs/{job.code}/log?after=abc", tokens["alice"])
    assert response.status_code == 400 and "after" in response.json()["error"]


def test_the_openapi_schema_is_served_and_lists_every_api_url(db):
    from django.urls import get_resolver

    response = Client().get("/api/openapi.json")
    assert response.status_code == 200
    documented = set(response.json()["paths"])
    resolver = get_resolver()
    routes = {"/api/" + str(p.pattern) for p in resolver.url_patterns if str(p.pattern) == "api/"
              for p in p.url_patterns if getattr(p, "name", None) not in ("api-openapi", None)}
    normalised = {r.replace("<uuid:", "{").replace("<int:", "{").replace(">", "}") for r in routes}
    assert normalised == documented


@pytest.mark.django_db(transaction=True)
def test_schemathesis_finds_no_server_error(live_server, tmp_path):
    """Property-based requests from the published schema: no 5xx, and responses conform to it."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from portal.management.commands.seed_demo import seed

    seed()
    from django.contrib.auth import get_user_model

    _, key = ApiToken.issue(get_user_model().objects.get(username="alice"), "schemathesis")
    st = shutil.which("st") or str(Path(sys.executable).with_name("st"))
    result = subprocess.run(
        [st, "run", f"{live_server.url}/api/openapi.json", "-H", f"Authorization: Bearer {key}",
         "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
         "--max-examples", "25", "--generation-deterministic", "--request-timeout", "20"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
