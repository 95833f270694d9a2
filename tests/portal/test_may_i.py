"""Every action × role × state: the page offers an action exactly when the action, posted, is carried out.

The pages are read and the actions posted through the real views (so the lifecycle and the runners refuse
by their own checks); each action is undone after it is tried, so every role meets the same state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.db import transaction
from django.urls import reverse

from gates import lifecycle
from gates.models import AuditEvent, CustomerTrace, Evaluation, Gate, PlanVersion, Role, SignOff
from gates.policy import Act
from runners import traces
from runners.models import Job, Status
from tests.portal.conftest import add_lab, add_person, verdict

TRACE = (b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\n"
         + b"".join(f"s{i},1,{20000 + 1000 * i},100,{i}.0\n".encode() for i in range(8)))


class _Undo(Exception):
    pass


def _evaluate(gate: Gate, result: str) -> None:
    evaluation = Evaluation.objects.create(gate=gate, plan_version=gate.pilot.signed_plan, verdict=result,
                                           result=verdict(gate.number, result), simulated=True)
    lifecycle.record_verdict(gate, evaluation)


def _signed_off(demo, number: int) -> None:
    gate = demo.pilot.gate(number)
    _evaluate(gate, "pass")
    lifecycle.sign_off_gate(gate, demo.alice, decision="approve")
    lifecycle.sign_off_gate(gate, demo.bob, decision="approve")


def _sign_plan(demo) -> None:
    lifecycle.sign_plan(demo.pilot.latest_plan, demo.alice)
    lifecycle.sign_plan(demo.pilot.latest_plan, demo.bob)


def _probe_run(demo, **fields) -> None:
    """A run that is no gate's (a probe), so that a gate's own run button is not held by it."""
    Job.objects.create(pilot=demo.pilot, kind=Job.Kind.PROBE, created_by=demo.alice, **fields)


STATES: dict[str, Callable] = {
    "draft, nobody signed": lambda demo: None,
    "draft, the vendor signed": lambda demo: lifecycle.sign_plan(demo.pilot.latest_plan, demo.alice),
    "G1 open, a run going": lambda demo: (_sign_plan(demo), _probe_run(demo, status=Status.RUNNING)),
    "G1 open, a run being canceled": lambda demo: (_sign_plan(demo),
                                                   _probe_run(demo, status=Status.RUNNING, cancel_requested=True)),
    "G1 passed, awaiting sign-off, a run ended": lambda demo: (_sign_plan(demo), _evaluate(demo.pilot.gate(1), "pass"),
                                                               _probe_run(demo, status=Status.SUCCESSFUL)),
    "G1 passed, the customer approved": lambda demo: (
        _sign_plan(demo), _evaluate(demo.pilot.gate(1), "pass"),
        lifecycle.sign_off_gate(demo.pilot.gate(1), demo.bob, decision="approve")),
    "G1 marginal, under review": lambda demo: (_sign_plan(demo), _evaluate(demo.pilot.gate(1), "marginal")),
    "G2 open, the plan amended": lambda demo: (_sign_plan(demo), _signed_off(demo, 1),
                                               lifecycle.amend_plan(demo.pilot, demo.alice)),
    "G4 open with the customer's trace": lambda demo: (
        _sign_plan(demo), [_signed_off(demo, n) for n in (1, 2, 3)],
        traces.upload(demo.pilot.gate(4), TRACE, "t.csv", demo.bob, "customer")),
    "halted at G1": lambda demo: (_sign_plan(demo), _evaluate(demo.pilot.gate(1), "fail")),
    "completed": lambda demo: (_sign_plan(demo), [_signed_off(demo, n) for n in (1, 2, 3, 4)]),
}


# What somebody is offered in each state (so that the walk below cannot pass by offering nothing).
OFFERED = {
    "draft, nobody signed": {Act.EDIT_PLAN, Act.SIGN_PLAN, Act.UPLOAD_TRACE},
    "draft, the vendor signed": {Act.SIGN_PLAN, Act.UPLOAD_TRACE},
    "G1 open, a run going": {Act.AMEND_PLAN, Act.START_RUN, Act.UPLOAD_TRACE, Act.CANCEL_RUN},
    "G1 open, a run being canceled": {Act.AMEND_PLAN, Act.START_RUN, Act.UPLOAD_TRACE},
    "G1 passed, awaiting sign-off, a run ended": {Act.AMEND_PLAN, Act.SIGN_OFF_GATE, Act.UPLOAD_TRACE},
    "G1 passed, the customer approved": {Act.AMEND_PLAN, Act.SIGN_OFF_GATE, Act.UPLOAD_TRACE},
    "G1 marginal, under review": {Act.AMEND_PLAN, Act.EXTEND_GATE, Act.SIGN_OFF_GATE, Act.UPLOAD_TRACE},
    "G2 open, the plan amended": {Act.EDIT_PLAN, Act.SIGN_PLAN, Act.START_RUN, Act.UPLOAD_TRACE},
    "G4 open with the customer's trace": {Act.AMEND_PLAN, Act.START_RUN, Act.UPLOAD_TRACE},
    "halted at G1": set(),
    "completed": set(),
}


@dataclass
class Action:
    act: Act
    page: Callable      # (pilot, subject) → the page's URL
    form: Callable      # (pilot, subject) → the URL the page's form posts to
    data: Callable      # () → the form's fields
    count: Callable     # (pilot) → what the action, carried out, changes


def _gate_url(pilot, gate):
    return reverse("gate", args=[pilot.code, gate.number])


ACTIONS = [
    Action(Act.EDIT_PLAN, lambda p, _s: reverse("plan", args=[p.code]),
           lambda p, _s: reverse("criterion_edit", args=[p.code, "g1-gpu-count"]),
           lambda: {"g1-gpu-count-op": ">=", "g1-gpu-count-threshold": "7", "g1-gpu-count-concurrency": "",
                    "g1-gpu-count-confidence": "95"},
           lambda p: AuditEvent.objects.filter(pilot=p, action="criterion.edited").count()),
    Action(Act.EDIT_PLAN, lambda p, _s: reverse("plan", args=[p.code]),
           lambda p, _s: reverse("plan_sample_trace", args=[p.code]), lambda: {"sample_trace": "allowed"},
           lambda p: AuditEvent.objects.filter(pilot=p, action="plan.sample_trace").count()),
    Action(Act.SIGN_PLAN, lambda p, _s: reverse("plan", args=[p.code]), lambda p, _s: reverse("plan_sign", args=[p.code]),
           lambda: {"comment": ""}, lambda p: SignOff.objects.filter(pilot=p, plan_version__isnull=False).count()),
    Action(Act.AMEND_PLAN, lambda p, _s: reverse("plan", args=[p.code]),
           lambda p, _s: reverse("plan_amend", args=[p.code]), dict,
           lambda p: PlanVersion.objects.filter(pilot=p).count()),
    Action(Act.START_RUN, _gate_url, lambda p, g: reverse("run_start", args=[p.code, g.number]), dict,
           lambda p: Job.objects.filter(pilot=p, kind=Job.Kind.GATE_RUN).count()),
    Action(Act.EXTEND_GATE, _gate_url, lambda p, g: reverse("gate_extend", args=[p.code, g.number]), dict,
           lambda p: AuditEvent.objects.filter(pilot=p, action="gate.extended").count()),
    Action(Act.SIGN_OFF_GATE, _gate_url, lambda p, g: reverse("gate_signoff", args=[p.code, g.number]),
           lambda: {"decision": "approve", "comment": ""},
           lambda p: SignOff.objects.filter(pilot=p, gate__isnull=False).count()),
    Action(Act.UPLOAD_TRACE, _gate_url, lambda p, g: reverse("gate_trace", args=[p.code, g.number]),
           lambda: {"trace": _upload()}, lambda p: CustomerTrace.objects.filter(pilot=p).count()),
    Action(Act.CANCEL_RUN, lambda _p, job: reverse("run", args=[job.code]),
           lambda _p, job: reverse("run_cancel", args=[job.code]), dict,
           lambda p: Job.objects.filter(pilot=p, cancel_requested=True).count()),
]


def _upload():
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile("again.csv", TRACE + b"s9,1,100,10,9.0\n", content_type="text/csv")


ROLES = [Role.VENDOR_ENGINEER, Role.VENDOR_LEAD, Role.CUSTOMER_ENGINEER, Role.CUSTOMER_APPROVER, Role.VIEWER]


def _subjects(pilot, act: Act) -> list:
    if act is Act.CANCEL_RUN:
        return list(Job.objects.filter(pilot=pilot))
    if act in (Act.START_RUN, Act.EXTEND_GATE, Act.SIGN_OFF_GATE, Act.UPLOAD_TRACE):
        return list(pilot.gates.filter(number__in={pilot.current_gate or 1, 4}))
    return [None]


def _carried_out(client, pilot, action: Action, subject) -> bool:
    before = action.count(pilot)
    try:
        with transaction.atomic():
            response = client.post(action.form(pilot, subject), action.data())
            after = action.count(pilot)
            raise _Undo
    except _Undo:
        pass
    assert response.status_code in (302, 403), f"{action.form(pilot, subject)} answered {response.status_code}"
    return after > before


@pytest.mark.parametrize("state", list(STATES))
def test_every_page_offers_exactly_what_its_action_accepts(client, demo, state):
    add_lab(demo, "SHA256:walk")
    STATES[state](demo)
    pilot = demo.pilot
    pilot.refresh_from_db()
    people = {role: add_person(f"p-{role}".replace("_", "-"), pilot.vendor if role.startswith("vendor") else pilot.customer,
                               role) for role in ROLES}
    disagreements, offered_somewhere = [], set()
    for role, person in people.items():
        client.force_login(person)
        pages: dict[str, str] = {}
        for action in ACTIONS:
            for subject in _subjects(pilot, action.act):
                url = action.page(pilot, subject)
                if url not in pages:
                    page = client.get(url)
                    assert page.status_code == 200, f"{url} answered {page.status_code}"
                    pages[url] = page.content.decode()
                offered = action.form(pilot, subject) in pages[url]
                done = _carried_out(client, pilot, action, subject)
                if offered != done:
                    disagreements.append(f"{action.act} by {role} on {subject or pilot}: the page "
                                         f"{'offers' if offered else 'does not offer'} it, the action "
                                         f"{'carries it out' if done else 'refuses'}")
                if offered:
                    offered_somewhere.add(action.act)
    assert not disagreements, "\n".join(disagreements)
    assert offered_somewhere == OFFERED[state]
