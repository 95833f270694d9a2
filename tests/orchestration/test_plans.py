"""The step list of each gate run, built from the signed plan (no worker needed)."""
from __future__ import annotations

import re

import pytest

from gates.lifecycle import TransitionRefused
from runners import traces
from runners.gateplans import spread_levels
from runners.models import Node, Site, Status, Step
from runners.orchestration import RunRefused, job_progress, start_gate_run
from runners.runs import sample_trace
from tests.orchestration.conftest import open_gate


@pytest.fixture
def site_of(demo):
    def make(count: int) -> Site:
        site = Site.objects.create(pilot=demo.pilot, name=f"site{count}", queue=f"q-site{count}")
        for i in range(1, count + 1):
            Node.objects.create(site=site, name=f"node{i}", host="127.0.0.1", username="fxpilot", simulated=True)
        return site
    return make


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("number", [1, 2, 3, 4])
def test_every_step_depends_only_on_earlier_steps_and_ends_with_evaluate_and_report(signed_pilot, site_of, number,
                                                                                    nodes):
    open_gate(signed_pilot.pilot, number, signed_pilot)
    if number == 4:
        traces.upload(signed_pilot.pilot.gate(4), sample_trace(), "ours.csv", signed_pilot.bob, "customer")
    job = start_gate_run(signed_pilot.pilot.gate(number), signed_pilot.alice, site=site_of(nodes))
    steps = list(job.steps.order_by("seq"))
    for step in steps:
        for key in ("after", "after_done", "after_verdict"):
            assert all(dep < step.seq for dep in step.params.get(key, [])), (step, step.params)
    assert [s.name for s in steps[-2:]] == ["evaluate", "report"]
    deploys = [s for s in steps if s.name == "deploy"]
    teardowns = [s for s in steps if s.name == "teardown"]
    assert sorted(t.params["deploy"] for t in teardowns) == [d.seq for d in deploys]
    assert all(t.params.get("always") for t in teardowns)
    assert job.params["time_scale"] > 0 and all(s.status == Status.PENDING for s in steps)


@pytest.mark.parametrize("nodes", [1, 3])
def test_g1_measures_the_cold_start_on_every_node_in_parallel(signed_pilot, site_of, nodes):
    job = start_gate_run(signed_pilot.pilot.gate(1), signed_pilot.alice, site=site_of(nodes))
    steps = {s.seq: s for s in job.steps.select_related("node")}
    probes = sorted(seq for seq, s in steps.items() if s.name == "probe")
    deploys = [s for s in steps.values() if s.name == "deploy"]
    # one deploy per node, each with empty compile caches, each waiting only for the probes (never for another node)
    assert sorted(s.node.name for s in deploys) == [f"node{i}" for i in range(1, nodes + 1)]
    assert all(s.params.get("cold_start") is True and s.arm == "recompute" for s in deploys)
    assert all(s.params["after"] == probes and "after_done" not in s.params for s in deploys)
    # the baseline is measured on the first node only; the others' servers are torn down at once
    assert {steps[s.params["deploy"]].node.name for s in steps.values() if s.name == "measure"} == {"node1"}
    evaluate = next(s for s in steps.values() if s.name == "evaluate")
    teardowns = [seq for seq, s in steps.items() if s.name == "teardown"]
    assert sorted(evaluate.params["after_done"]) == sorted(teardowns) and len(teardowns) == nodes


def test_g3_measures_every_compared_pair_of_cells_on_one_node(signed_pilot, site_of):
    open_gate(signed_pilot.pilot, 3, signed_pilot)
    job = start_gate_run(signed_pilot.pilot.gate(3), signed_pilot.alice, site=site_of(2))
    cells = {}
    for step in Step.objects.filter(job=job, name="measure").select_related("node"):
        for level in step.params["concurrency"]:
            cells[(step.arm, level)] = step.node.name
    assert cells == {("fx", 32): "node1", ("local_nvme", 32): "node1", ("fx", 16): "node2",
                     ("local_nvme", 16): "node2", ("recompute", 16): "node2", ("fx", 8): "node2",
                     ("local_nvme", 8): "node2"}


def test_levels_are_spread_heaviest_first_keeping_the_arms_of_a_level_together():
    assert spread_levels({"fx": [8, 16, 32], "recompute": [16]}, 1) == [{"fx": [8, 16, 32], "recompute": [16]}]
    assert spread_levels({"fx": [8, 16, 32], "local_nvme": [8, 16, 32]}, 3) == [
        {"fx": [32], "local_nvme": [32]}, {"fx": [16], "local_nvme": [16]}, {"fx": [8], "local_nvme": [8]}]


def test_g4_without_the_customers_trace_is_refused_unless_the_plan_allows_a_sample(signed_pilot, site_of):
    from runners.models import Job

    open_gate(signed_pilot.pilot, 4, signed_pilot)
    with pytest.raises(RunRefused, match="G4 needs the customer's session trace: upload it on the G4 page"):
        start_gate_run(signed_pilot.pilot.gate(4), signed_pilot.alice, site=site_of(2))
    assert not Job.objects.exists()


def test_g4_replays_the_uploaded_trace_and_says_whose_it_is(signed_pilot, site_of):
    open_gate(signed_pilot.pilot, 4, signed_pilot)
    uploaded = traces.upload(signed_pilot.pilot.gate(4), sample_trace(), "ours.csv", signed_pilot.bob, "customer")
    job = start_gate_run(signed_pilot.pilot.gate(4), signed_pilot.alice, site=site_of(1))
    kept = job.artifacts.get(kind="trace")
    assert kept.name == "customer-trace.csv" and kept.sha256 == uploaded.sha256
    assert f"the customer's trace ours.csv uploaded by {signed_pilot.bob}" in "".join(
        job.chunks.values_list("text", flat=True))


def test_g4_replays_a_sample_only_when_the_signed_plan_says_so_and_says_it(demo, site_of):
    from gates import lifecycle

    version = demo.pilot.latest_plan
    traces.allow_sample(version, demo.alice)
    lifecycle.sign_plan(version, demo.alice)
    lifecycle.sign_plan(version, demo.bob)
    with pytest.raises(TransitionRefused, match="signed and frozen"):
        traces.allow_sample(version, demo.alice)
    open_gate(demo.pilot, 4, demo)
    job = start_gate_run(demo.pilot.gate(4), demo.alice, site=site_of(2))
    assert job.artifacts.filter(name="sample-trace.csv", kind="trace").exists()
    assert "generated sample trace (sample-trace.csv) — not the customer's traffic" in "".join(
        job.chunks.values_list("text", flat=True))
    names = list(job.steps.order_by("seq").values_list("name", flat=True))
    assert {"replay", "share", "soak", "fault"} <= set(names)


def test_g4_keeps_the_customer_trace_with_the_run(signed_pilot, site_of):
    open_gate(signed_pilot.pilot, 4, signed_pilot)
    csv = b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,100,10,0\n"
    job = start_gate_run(signed_pilot.pilot.gate(4), signed_pilot.alice, site=site_of(1), trace=csv)
    assert job.artifacts.get(kind="trace").name == "customer-trace.csv"


def test_a_run_is_refused_on_a_gate_that_is_not_open_and_while_another_run_goes(signed_pilot, site_of):
    site = site_of(1)
    with pytest.raises(TransitionRefused, match="G2 is not yet open"):
        start_gate_run(signed_pilot.pilot.gate(2), signed_pilot.alice, site=site)
    start_gate_run(signed_pilot.pilot.gate(1), signed_pilot.alice, site=site)
    with pytest.raises(RunRefused, match="already has a run going"):
        start_gate_run(signed_pilot.pilot.gate(1), signed_pilot.alice, site=site)


def test_a_run_needs_a_site_with_gpu_nodes(signed_pilot):
    with pytest.raises(RunRefused, match="no site with a GPU node"):
        start_gate_run(signed_pilot.pilot.gate(1), signed_pilot.alice)


def test_progress_counts_steps_and_requests_and_estimates_the_time_left(signed_pilot, site_of):
    from datetime import timedelta

    from django.utils import timezone

    from runners.models import Job

    job = start_gate_run(signed_pilot.pilot.gate(1), signed_pilot.alice, site=site_of(1))
    steps = list(job.steps.order_by("seq"))
    Job.objects.filter(pk=job.pk).update(status=Status.RUNNING, started=timezone.now() - timedelta(seconds=100))
    Step.objects.filter(pk__in=[s.pk for s in steps[:4]]).update(status=Status.SUCCESSFUL)
    measure = next(s for s in steps if s.name == "measure")
    Step.objects.filter(pk=measure.pk).update(status=Status.RUNNING, requests_done=10)
    job.refresh_from_db()
    progress = job_progress(job)
    assert progress["steps_total"] == 9 and progress["steps_finished"] == 4
    assert progress["step"] == measure.seq
    assert progress["requests_done"] == 10 and progress["requests_total"] == measure.requests_total + 16
    assert progress["current"][0]["name"] == "measure"
    assert 0 < progress["eta_seconds"] < 200


def test_beat_schedules_the_reconcile_sweep_on_the_control_queue(settings):
    from fxpilot.celery import app

    entry = app.conf.beat_schedule["reconcile stale steps"]
    assert entry["task"] == "runners.tasks.reconcile"
    assert entry["options"]["queue"] == settings.CELERY_TASK_DEFAULT_QUEUE
    assert entry["schedule"] == settings.FXPILOT_RECONCILE_SECONDS


def test_a_step_is_claimed_once(signed_pilot, site_of):
    from runners.engine import execute_step

    job = start_gate_run(signed_pilot.pilot.gate(1), signed_pilot.alice, site=site_of(1))
    probe = job.steps.get(seq=1)
    Step.objects.filter(pk=probe.pk).update(status=Status.RUNNING, claimed_by="elsewhere#1")
    assert execute_step(probe.pk, "w") == "not pending"
    deploy = job.steps.get(name="deploy")
    assert execute_step(deploy.pk, "w") == "not ready"  # its probe has not finished
    assert Step.objects.get(pk=deploy.pk).status == Status.PENDING


def test_reconcile_follows_a_started_remote_process_again_and_reruns_any_other_stale_step(signed_pilot, site_of):
    from datetime import timedelta

    from django.utils import timezone

    from runners.engine import reconcile

    job = start_gate_run(signed_pilot.pilot.gate(1), signed_pilot.alice, site=site_of(1))
    old = timezone.now() - timedelta(hours=1)
    probe = job.steps.get(seq=1)
    measure = job.steps.get(name="measure")
    Step.objects.filter(pk=probe.pk).update(status=Status.RUNNING, claimed_by="dead#1", heartbeat=old, attempts=1)
    Step.objects.filter(pk=measure.pk).update(status=Status.RUNNING, claimed_by="dead#2", heartbeat=old, attempts=1,
                                              remote={"dir": "/x", "pid": 10, "pgid": 10})
    counts = reconcile()
    assert (counts["requeued"], counts["repolled"]) == (1, 1)
    probe.refresh_from_db()
    measure.refresh_from_db()
    assert probe.status == Status.PENDING and probe.claimed_by == ""
    assert measure.status == Status.RUNNING and measure.claimed_by.startswith("reconcile#") and measure.attempts == 1
    Step.objects.filter(pk=probe.pk).update(status=Status.RUNNING, heartbeat=old, attempts=4)
    assert reconcile()["gave_up"] == 1
    probe.refresh_from_db()
    assert probe.status == Status.ERROR and "worker died 4 times" in probe.error


def test_cancel_run_asks_the_run_to_stop_and_audits_who_asked(signed_pilot, site_of):
    from django.core.management import call_command

    from gates.models import AuditEvent

    job = start_gate_run(signed_pilot.pilot.gate(1), signed_pilot.alice, site=site_of(1))
    call_command("cancel_run", str(job.code)[:8], "--as", "bob")
    job.refresh_from_db()
    assert job.cancel_requested
    event = AuditEvent.objects.get(action="run.cancel_requested")
    assert event.actor_label == "bob" and event.object_id == str(job.pk)


def test_a_marginal_run_is_extended_by_one_repetition_of_every_cell_then_judged_again(signed_pilot, site_of):
    from gates.models import Evaluation
    from runners.runs import extend_run

    open_gate(signed_pilot.pilot, 3, signed_pilot)
    job = start_gate_run(signed_pilot.pilot.gate(3), signed_pilot.alice, site=site_of(2), params={"repetitions": 2})
    before = job.steps.count()
    evaluate = job.steps.get(name="evaluate")
    job.steps.exclude(name="report").update(status=Status.SUCCESSFUL)
    evaluation = Evaluation.objects.create(gate=job.gate, job=job, plan_version=signed_pilot.pilot.signed_plan,
                                           verdict="marginal", result={"verdict": "marginal", "gate": 3})
    added = extend_run(job, evaluate, evaluation, first_repetition=3)
    steps = list(job.steps.order_by("seq"))
    assert len(steps) == before + added
    new = [s for s in steps if s.seq > evaluate.seq and s.name != "report"]
    measures = [s for s in new if s.name == "measure"]
    original = [s for s in steps if s.name == "measure" and s.seq < evaluate.seq]
    assert {(m.node.name, m.arm, tuple(m.params["concurrency"])) for m in measures} == {
        (s.node.name, s.arm, tuple(s.params["concurrency"])) for s in original}
    assert all(m.params["first_repetition"] == 3 and m.params["repetitions"] == 1 for m in measures)
    again = new[-1]
    assert again.name == "evaluate" and again.params["after_evaluation"] == evaluation.pk
    assert steps[-1].name == "report" and steps[-1].params["after_verdict"] == [again.seq]
    for step in steps:
        for key in ("after", "after_done", "after_verdict"):
            assert all(dep < step.seq for dep in step.params.get(key, [])), step
    # A second extension measures the run's own cells once more, not the first extension's again.
    job.steps.exclude(name="report").update(status=Status.SUCCESSFUL)
    assert extend_run(job, again, evaluation, first_repetition=4) == added
    assert job.steps.filter(name="measure", params__first_repetition=4).count() == len(original)


@pytest.mark.parametrize("params, message", [
    ({"time_scale": 0}, "params.time_scale: 0 is not a number above 0"),
    ({"repetitions": "3; rm -rf /"}, "params.repetitions: '3; rm -rf /' is not a whole number"),
    ({"levels": {"fx": [8, "x"]}}, "params.levels:"),
    ({"workloads": {"cold_recovery": {"prompt_tokens": "$(id)"}}}, "params.workloads.cold_recovery.prompt_tokens"),
    ({"colour": "red"}, "params.colour: unknown parameter"),
])
def test_bad_run_parameters_are_refused_before_the_run_exists(signed_pilot, site_of, params, message):
    from runners.models import Job

    with pytest.raises(RunRefused, match=re.escape(message)):
        start_gate_run(signed_pilot.pilot.gate(1), signed_pilot.alice, site=site_of(1), params=params)
    assert not Job.objects.exists()


def test_a_bad_customer_trace_is_refused_naming_the_line(signed_pilot, site_of):
    from runners.models import Job

    open_gate(signed_pilot.pilot, 4, signed_pilot)
    csv = b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,100,10,0\nb,1,lots,10,1\n"
    with pytest.raises(RunRefused, match="customer-trace.csv.*line 3"):
        start_gate_run(signed_pilot.pilot.gate(4), signed_pilot.alice, site=site_of(1), trace=csv)
    assert not Job.objects.exists()


def _evaluate_with(signed_pilot, site_of, verdict: str, result: dict):
    from gates.models import Evaluation
    from runners.kinds import StepContext
    from runners.steps import run_evaluate

    job = start_gate_run(signed_pilot.pilot.gate(1), signed_pilot.alice, site=site_of(1),
                         params={"extend_marginal": False})
    Evaluation.objects.create(gate=job.gate, job=job, plan_version=signed_pilot.pilot.signed_plan, verdict=verdict,
                              result={"verdict": verdict, "gate": 1, **result})
    step = job.steps.get(name="evaluate")
    return job, lambda: run_evaluate(StepContext(step, "t#1"))


def test_a_fail_verdict_fails_the_step_and_halts_the_pilot_through_the_lifecycle(signed_pilot, site_of):
    from gates.models import Pilot
    from runners.kinds import StepFailed

    job, evaluate = _evaluate_with(signed_pilot, site_of, "fail", {"criteria": [{"key": "g1-link", "verdict": "fail"}]})
    with pytest.raises(StepFailed, match="G1 failed: g1-link"):
        evaluate()
    pilot = Pilot.objects.get(pk=signed_pilot.pilot.pk)
    assert pilot.state == Pilot.State.HALTED and pilot.gate(1).state == "failed"


def test_an_invalid_measurement_is_an_error_and_leaves_the_gate_open(signed_pilot, site_of):
    from gates.models import Pilot
    from runners.kinds import StepError

    checks = {"validity": {"valid": False, "checks": [{"name": "min-requests-per-cell", "ok": False, "detail": "3 < 8"}]}}
    job, evaluate = _evaluate_with(signed_pilot, site_of, "invalid", checks)
    with pytest.raises(StepError, match="invalid — min-requests-per-cell: 3 < 8"):
        evaluate()
    pilot = Pilot.objects.get(pk=signed_pilot.pilot.pk)
    assert pilot.state == Pilot.State.ACTIVE and pilot.gate(1).state == "open"


def test_a_pass_verdict_awaits_sign_off_and_is_recorded_once_when_the_step_runs_again(signed_pilot, site_of):
    from gates.models import AuditEvent, Pilot

    job, evaluate = _evaluate_with(signed_pilot, site_of, "pass", {"criteria": []})
    assert evaluate()["verdict"] == "pass"
    assert evaluate()["verdict"] == "pass"  # a worker died after recording it: the re-run changes nothing
    assert Pilot.objects.get(pk=signed_pilot.pilot.pk).gate(1).state == "awaiting_signoff"
    assert AuditEvent.objects.filter(action="gate.verdict").count() == 1
