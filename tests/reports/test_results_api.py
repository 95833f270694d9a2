"""GET /api/v1/runs/<run>/results: the run's export as JSON, 404 outside the person's organisation."""
from __future__ import annotations

import json

import pytest
from django.test import Client

from gates.models import ApiToken
from runners.artifacts import store_bytes
from runners.models import Job


def _request(i: int, ttft: float) -> dict:
    return {"schema": "fxpilot.request/1", "run_id": "r1", "arm": "fx", "instance": "n1", "phase": "measure",
            "concurrency": 4, "repetition": 1, "session": f"s{i}", "prompt_tokens": 100, "cached_tokens": 0,
            "output_tokens": 3, "t_send": float(i), "t_first_token": i + ttft, "t_end": i + ttft + 0.2,
            "wall_anchor": 1_800_000_000.0, "status": "ok", "error": None, "simulated": True}


@pytest.fixture
def tokens(demo) -> dict[str, str]:
    return {name: ApiToken.issue(getattr(demo, name), "test")[1] for name in ("bob", "charlie")}


def _get(path: str, token: str):
    return Client().get(path, headers={"Authorization": f"Bearer {token}"})


def test_the_run_results_answer_in_the_peers_forms_and_404_to_another_customer(signed_pilot, tokens):
    job = Job.objects.create(pilot=signed_pilot.pilot, gate=signed_pilot.pilot.gate(1))
    lines = [_request(i, t) for i, t in enumerate([0.25, 0.5, 0.75, 1.0])]
    store_bytes(job, "node1/records.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode(), kind="records",
                simulated=True)
    path = f"/api/v1/runs/{job.code}/results"
    assert _get(path, tokens["charlie"]).status_code == 404
    answer = _get(path, tokens["bob"])
    assert answer.status_code == 200
    data = answer.json()
    assert data["fxpilot"]["evidence"] == "simulated" and data["fxpilot"]["plan_version"] == 1
    cell = data["cells"][0]
    assert (cell["arm"], cell["concurrency"], cell["phase"]) == ("fx", 4, "measure")
    assert cell["aiperf"]["time_to_first_token"]["p50"] == pytest.approx(625.0)
    assert cell["llm_d"]["version"] == "0.2"
    assert data["customer_measurements"] == []


def test_a_run_without_records_says_so(signed_pilot, tokens):
    job = Job.objects.create(pilot=signed_pilot.pilot, gate=signed_pilot.pilot.gate(1))
    answer = _get(f"/api/v1/runs/{job.code}/results", tokens["bob"])
    assert answer.status_code == 404 and "no stored records" in answer.json()["error"]
