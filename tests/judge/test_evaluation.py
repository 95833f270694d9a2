"""The ORM adapter: a job's artifacts → a stored Evaluation that replays bit for bit."""
from __future__ import annotations

import pytest

from gates.judge import JUDGE_VERSION, RecordError, canonical_json, synthetic
from gates.models import Evaluation
from runners.artifacts import ArtifactMismatch, store_bytes
from runners.evaluation import ReplayMismatch, evaluate_job, replay_evaluation, replays_identically
from runners.models import Job

KINDS = {"records.jsonl": "records", "records.summary.json": "phase-summary", "retrieve.jsonl": "retrieve"}


def job_with_inputs(pilot, gate_number: int, files: list[tuple[str, bytes]]) -> Job:
    job = Job.objects.create(pilot=pilot, gate=pilot.gate(gate_number), kind=Job.Kind.GATE_RUN)
    for name, data in files:
        store_bytes(job, name, data, kind=KINDS.get(name, "inventory"), simulated=True)
    store_bytes(job, "server.log", b"not judged\n", kind="server-log", simulated=True)
    return job


@pytest.mark.parametrize("gate_number", [2, 3])
def test_an_evaluation_replays_bit_for_bit(signed_pilot, gate_number):
    job = job_with_inputs(signed_pilot.pilot, gate_number, synthetic.gate_inputs(gate_number))
    evaluation = evaluate_job(job)
    stored = Evaluation.objects.get(pk=evaluation.pk)
    assert stored.verdict == "pass" and stored.simulated and stored.job_id == job.pk
    assert stored.plan_version == signed_pilot.pilot.signed_plan
    assert stored.result["plan_sha256"] == stored.plan_version.to_plan().sha256
    assert stored.inputs == {a.name: a.sha256 for a in job.artifacts.exclude(kind="server-log")}
    assert stored.result["inputs"] == stored.inputs
    assert canonical_json(replay_evaluation(stored)) == canonical_json(stored.result)
    assert replays_identically(stored)


def test_the_gate_state_is_left_to_the_lifecycle(signed_pilot):
    job = job_with_inputs(signed_pilot.pilot, 3, synthetic.gate_inputs(3, slowdown={"fx": 1.3}))
    gate = signed_pilot.pilot.gate(3)
    before = (gate.state, gate.verdict)
    evaluation = evaluate_job(job)
    gate.refresh_from_db()
    assert evaluation.verdict == "fail" and (gate.state, gate.verdict) == before


def test_an_altered_artifact_is_refused_on_replay(signed_pilot):
    # its own seed: the content-addressed file is not shared with any other test
    job = job_with_inputs(signed_pilot.pilot, 3, synthetic.gate_inputs(3, seed=41))
    evaluation = evaluate_job(job)
    artifact = job.artifacts.get(name="records.jsonl")
    original = artifact.path.read_bytes()
    artifact.path.chmod(0o644)
    artifact.path.write_bytes(original.replace(b'"fx"', b'"xf"', 1))
    try:
        with pytest.raises(ArtifactMismatch):
            replay_evaluation(evaluation)
    finally:
        artifact.path.write_bytes(original)
        artifact.path.chmod(0o444)


def test_a_missing_artifact_is_refused_on_replay(signed_pilot):
    job = job_with_inputs(signed_pilot.pilot, 3, synthetic.gate_inputs(3))
    evaluation = evaluate_job(job)
    job.artifacts.filter(name="records.summary.json").delete()
    with pytest.raises(ReplayMismatch, match="records.summary.json"):
        replay_evaluation(evaluation)


def test_bad_input_stores_no_evaluation(signed_pilot):
    job = job_with_inputs(signed_pilot.pilot, 3, [("records.jsonl", b'{"schema": "fxpilot.request/1"\n')])
    with pytest.raises(RecordError, match="records.jsonl, line 1"):
        evaluate_job(job)
    assert not Evaluation.objects.filter(job=job).exists()


def test_a_verdict_stored_by_an_earlier_judge_keeps_its_version_and_rejudging_says_so(signed_pilot):
    job = job_with_inputs(signed_pilot.pilot, 3, synthetic.gate_inputs(3))
    evaluation = evaluate_job(job)
    old = {**evaluation.result, "judge_version": "1", "verdict": "pass"}
    Evaluation.objects.filter(pk=evaluation.pk).update(result=old)
    stored = Evaluation.objects.get(pk=evaluation.pk)
    again = replay_evaluation(stored)
    assert again["judge_version"] == JUDGE_VERSION and again["rejudged"]["stored_judge_version"] == "1"
    assert "keeps its verdict 'pass' of judge version 1" in again["rejudged"]["note"]
    assert not replays_identically(stored)
    assert Evaluation.objects.get(pk=evaluation.pk).result["judge_version"] == "1"  # nothing stored changes


def test_a_run_that_set_its_own_repetitions_is_judged_at_the_look_its_records_reach(signed_pilot):
    from gates.judge import sequential

    job = job_with_inputs(signed_pilot.pilot, 3, synthetic.gate_inputs(3))
    job.params = {**(job.params or {}), "repetitions": 16}
    job.save(update_fields=["params"])
    evaluation = evaluate_job(job)  # the synthetic records have 12 repetitions: look 2 of the run's (8, 12, 16)
    design = evaluation.result["sequential"]
    assert (design["looks"], design["look"], design["run"]) == ([8, 12, 16], 2, 1)
    level = sequential.nominal_levels((8, 12, 16), 0.02)[1]
    assert evaluation.result["criteria"][0]["confidence"] == pytest.approx(level, abs=1e-6)
    assert evaluation.result["extension"]["extensions"] == 1
    assert replays_identically(evaluation)


def test_a_gates_second_run_spends_what_the_first_left_and_a_third_is_refused(signed_pilot):
    from runners.evaluation import prior_runs
    from runners.runs import RunRefused, _require_error_budget

    first = job_with_inputs(signed_pilot.pilot, 3, synthetic.gate_inputs(3))
    assert prior_runs(first) == 0
    evaluate_job(first)
    second = job_with_inputs(signed_pilot.pilot, 3, synthetic.gate_inputs(3, seed=1))
    assert prior_runs(second) == 1
    result = evaluate_job(second).result["sequential"]
    assert result["run"] == 2 and result["alpha_run"] == 0.005 and result["alpha_spent"] > 0.02
    assert prior_runs(first) == 0  # a replay of the first run counts what it counted
    with pytest.raises(RunRefused, match="error budget"):
        _require_error_budget(first.gate)


def test_an_extended_run_says_how_often_and_why_on_the_gate_page_and_in_the_report_context(signed_pilot, client):
    from django.urls import reverse

    from reports.context import gate_report_context
    from runners.evaluation import extension_history

    job = job_with_inputs(signed_pilot.pilot, 3, synthetic.gate_inputs(3))
    marginal = {"verdict": "marginal", "gate": 3, "criteria": [{"key": "g3-ttft-vs-local", "verdict": "marginal"}]}
    Evaluation.objects.create(gate=job.gate, job=job, plan_version=signed_pilot.pilot.signed_plan,
                              verdict="marginal", result=marginal, inputs={})
    job.params = {**(job.params or {}), "repetitions": 16}
    job.save(update_fields=["params"])
    final = evaluate_job(job)
    history = extension_history(final)
    assert history["times"] == 1 and history["keys"] == ["g3-ttft-vs-local"]
    assert history["confidence"] == final.result["sequential"]["confidence"]
    assert gate_report_context(job.gate, final)["extended"] == history
    client.force_login(signed_pilot.alice)
    page = client.get(reverse("gate", args=[signed_pilot.pilot.code, 3])).content.decode()
    assert 'id="gate-extended"' in page and "extended 1 time(s)" in page and "g3-ttft-vs-local" in page
