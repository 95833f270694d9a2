"""One gate evaluation followed call by call, from its Celery task to the verdict and the report: it only moves
downward through the floors of docs/architecture.md, but for the one hop the engine takes through the step-kind
registry to the report step of `reports` (registered by ReportsConfig.ready(), never imported by runners).

Every call of a project function made while the two steps run is seen (sys.settrace): the callee's floor is
compared with the floor of the nearest project function up the stack (frames of Django, Celery or a library in
between are passed over, so a call up through a framework counts too).
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType

import pytest

from gates import lifecycle
from gates.judge import synthetic
from gates.models import Evaluation, Report
from runners.artifacts import store_bytes
from runners.kinds import KINDS
from runners.models import Job, Status, Step
from tests.foundation.test_architecture import ARCHITECTURE, ROOT, read_floors

pytestmark = pytest.mark.django_db
FLOORS = {package: floor.number for package, floor in read_floors(ARCHITECTURE.read_text(encoding="utf-8")).items()}
HANDLERS = ("run", "start", "poll", "finish", "cancel")


@dataclass
class Trace:
    """What the tracer saw: the project modules in the order they were first called, every move to another
    floor, and the moves up (the registry hops among them)."""

    modules: list[str] = field(default_factory=list)
    moves: list[tuple[str, str]] = field(default_factory=list)
    up: list[tuple[str, ...]] = field(default_factory=list)


class FloorTracer:
    def __init__(self, registered: set[CodeType]):
        self.registered = registered
        self.places: dict[CodeType, tuple[str, str] | None] = {}
        self.trace = Trace()

    def place(self, code: CodeType) -> tuple[str, str] | None:
        """(package, module) of a project function, None for anything else."""
        if code not in self.places:
            try:
                relative = Path(code.co_filename).resolve().relative_to(ROOT)
            except ValueError:
                relative = None
            found = None
            if relative is not None and relative.parts[0] in FLOORS and relative.suffix == ".py":
                parts = list(relative.with_suffix("").parts)
                found = (parts[0], ".".join(parts[:-1] if parts[-1] == "__init__" else parts))
            self.places[code] = found
        return self.places[code]

    def __call__(self, frame: FrameType, event: str, arg) -> None:
        code = frame.f_code
        callee = self.place(code)
        if callee is None or code.co_name == "<module>":  # imports are the static test's business
            return
        if callee[1] not in self.trace.modules:
            self.trace.modules.append(callee[1])
        caller_frame = frame.f_back
        while caller_frame is not None and self.place(caller_frame.f_code) is None:
            caller_frame = caller_frame.f_back
        if caller_frame is None:
            return  # called from the test
        caller = self.place(caller_frame.f_code)
        if callee[0] != caller[0]:
            move = (f"{caller[1]}.{caller_frame.f_code.co_name}", f"{callee[1]}.{code.co_name}")
            self.trace.moves.append(move)
            if FLOORS[callee[0]] > FLOORS[caller[0]]:
                registry = caller[1] == "runners.engine" and code in self.registered
                self.trace.up.append(move + (("registry",) if registry else ()))

    def follow(self, call: Callable[[], object]) -> object:
        previous = sys.gettrace()
        sys.settrace(self)  # a global trace function sees each call; returning None, it traces no line
        try:
            return call()
        finally:
            sys.settrace(previous)


def registered_handlers() -> set[CodeType]:
    return {getattr(kind, name).__code__ for kind in KINDS.values() for name in HANDLERS if getattr(kind, name)}


def test_the_tracer_sees_a_call_up_that_takes_no_registry():
    # a function whose code says it is in runners/ calls one of reports/: a move up, not through the registry
    namespace: dict = {}
    exec(compile("def call(f):\n    return f()\n", str(ROOT / "runners" / "probe_of_the_tracer.py"), "exec"), namespace)
    from reports.checks import localised

    tracer = FloorTracer(registered_handlers())
    tracer.follow(lambda: namespace["call"](lambda: localised({"checks": []})))
    assert tracer.trace.up == [("runners.probe_of_the_tracer.call", "reports.checks.localised")]


def _open_gate(pilot, number: int, people) -> None:
    """Gates before `number` passed and signed off by both parties, so gate `number` is open."""
    for earlier in range(1, number):
        gate = pilot.gate(earlier)
        evaluation = Evaluation.objects.create(gate=gate, plan_version=pilot.signed_plan, verdict="pass",
                                               result={"verdict": "pass", "gate": earlier, "criteria": []},
                                               simulated=True)
        lifecycle.record_verdict(gate, evaluation, who="test")
        lifecycle.sign_off_gate(gate, people.alice, decision="approve")
        lifecycle.sign_off_gate(gate, people.bob, decision="approve")


def test_one_gate_evaluation_from_its_task_to_the_report_only_moves_down(signed_pilot):
    from runners.tasks import run_step

    pilot = signed_pilot.pilot
    _open_gate(pilot, 3, signed_pilot)
    gate = pilot.gate(3)
    job = Job.objects.create(pilot=pilot, gate=gate, kind=Job.Kind.GATE_RUN, params={"extend_marginal": False})
    kinds = {"records.jsonl": "records", "records.summary.json": "phase-summary"}
    for name, data in synthetic.gate_inputs(3):
        store_bytes(job, name, data, kind=kinds.get(name, "inventory"), simulated=True)
    evaluate = Step.objects.create(job=job, seq=1, name="evaluate")
    report = Step.objects.create(job=job, seq=2, name="report", params={"after_verdict": [1], "language": "en"})

    tracer = FloorTracer(registered_handlers())
    for step in (evaluate, report):
        tracer.follow(lambda step=step: run_step(step.pk))  # the Celery task, called as a worker calls it
        step.refresh_from_db()
        assert step.status == Status.SUCCESSFUL, step.error

    gate.refresh_from_db()
    evaluation = Evaluation.objects.get(job=job)
    assert gate.state == "awaiting_signoff" and gate.verdict == evaluation.verdict == "pass"
    assert Report.objects.filter(evaluation=evaluation, kind=Report.Kind.GATE).exists()
    trace = tracer.trace
    # the path went where the document says, in that order, and then rendered and signed the report …
    stops = ["runners.tasks", "runners.engine", "runners.steps", "runners.evaluation", "gates.judge",
             "gates.consequences", "gates.lifecycle", "reports.steps"]
    seen = [m for m in trace.modules if any(m == s or m.startswith(s + ".") for s in stops)]
    firsts = [next((m for m in seen if m == s or m.startswith(s + ".")), None) for s in stops]
    assert None not in firsts and firsts == sorted(firsts, key=seen.index), seen
    assert {"reports.service", "reports.render", "reports.sign"} <= set(trace.modules), trace.modules
    # … it crossed floors (so the check had something to check) …
    assert ("runners.evaluation.evaluate_job", "gates.judge.verdicts.evaluate") in trace.moves, trace.moves
    # … and its one move up is the engine running the report kind it found in the registry.
    assert trace.up == [("runners.engine.execute_step", "reports.steps.run_report", "registry")], trace.up
