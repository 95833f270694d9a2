"""Run creation: check a run's parameters, build its steps from the signed plan, keep its trace, dispatch it.

`start_gate_run` creates a gate run (refused with RunRefused saying why); `extend_run` appends
more repetitions and a new evaluate to a run whose verdict was marginal. What each gate runs is
runners.gateplans; how the steps then move is runners.engine.
"""
from __future__ import annotations

import csv
import io
import random
import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from gates import lifecycle
from gates.judge import sequential
from gates.models import AuditAction, Evaluation, Gate
from runners import gateplans, traces
from runners.artifacts import store_bytes
from runners.config import ARMS
from runners.dispatch import dispatch_advance
from runners.gateplans import StepList
from runners.models import UNFINISHED, Artifact, Job, LeaseRefused, Node, Site, Status, Step, take_nodes
from runners.output import system_line
from runners.validators import validate_trace_size

TRACE_NAME = "customer-trace.csv"
SAMPLE_TRACE_NAME = "sample-trace.csv"


class RunRefused(Exception):
    """A run that cannot start: the message says why (no nodes, a run already going, a closed gate, a bad parameter)."""


def _positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _levels(value) -> bool:
    return isinstance(value, list) and bool(value) and all(_positive_int(v) for v in value)


# Run parameters (job.params): each reaches a node's command line, so each is checked before the run exists.
PARAMS = {
    "time_scale": (_positive_number, gettext_lazy("a number above 0")),
    "repetitions": (_positive_int, gettext_lazy("a whole number ≥ 1")),
    "concurrency": (_positive_int, gettext_lazy("a whole number ≥ 1")),
    "levels": (lambda v: isinstance(v, dict) and bool(v) and all(a in ARMS and _levels(c) for a, c in v.items()),
               gettext_lazy("a mapping of arm (recompute, dram, local_nvme, fx) → list of concurrency levels")),
    "fio_runtime": (lambda v: _positive_int(v) and v <= 3600, gettext_lazy("whole seconds, 1–3600")),
    "fio_size": (lambda v: isinstance(v, str) and bool(re.fullmatch(r"\d{1,6}[KMGkmg]?", v)),
                 gettext_lazy("a size such as 16M or 4G")),
    "soak_seconds": (_positive_number, gettext_lazy("a number of seconds above 0")),
    "soak_rate": (_positive_number, gettext_lazy("requests per second above 0")),
    "soak_min_requests": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                          gettext_lazy("a whole number ≥ 0 (0: the soak ends at its length)")),
    "workloads": (lambda v: isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()),
                  gettext_lazy("a mapping of workload name → settings, as in the plan")),
    "extend_marginal": (lambda v: isinstance(v, bool), gettext_lazy("true or false")),
    "language": (lambda v: v in ("en", "zh-hans"), gettext_lazy("en or zh-hans")),
    "report_language": (lambda v: v in ("en", "zh-hans"), gettext_lazy("en or zh-hans")),
}


def validate_params(params: dict) -> dict:
    """The run's parameters, or RunRefused naming the first bad one and what it accepts."""
    if not isinstance(params, dict):
        raise RunRefused(_("the run parameters must be a mapping"))
    for key, value in params.items():
        if key not in PARAMS:
            raise RunRefused(_("params.%(key)s: unknown parameter (known: %(known)s)")
                             % {"key": key, "known": ", ".join(sorted(PARAMS))})
        check, accepts = PARAMS[key]
        if not check(value):
            raise RunRefused(_("params.%(key)s: %(value)r is not %(accepts)s") % {"key": key, "value": value,
                                                                                   "accepts": accepts})
    for name, values in (params.get("workloads") or {}).items():
        for field_name, value in values.items():
            if not (_positive_number(value) or _levels(value)):
                raise RunRefused(_("params.workloads.%(name)s.%(field)s: %(value)r is not a positive number")
                                 % {"name": name, "field": field_name, "value": value})
    return params


@transaction.atomic
def start_gate_run(gate: Gate, who=None, *, site: Site | None = None, params: dict | None = None,
                   trace: bytes | None = None, wait: bool = True) -> Job:
    """Create a gate run with its steps and dispatch it once the transaction commits.

    A node held by another run: with `wait` the run is created waiting (its log and page say for which node
    and run) and the engine starts it once that run gives the node back; without, RunRefused names the run.

    `trace` is the customer's session trace CSV for G4's replay; without one G4 replays the trace uploaded
    on its page, and without that it is refused unless the signed plan's G4 says `sample_trace: allowed`
    (then it replays a generated sample trace and its log says so).
    """
    gate = Gate.objects.select_for_update().select_related("pilot").get(pk=gate.pk)
    lifecycle.require_runnable(gate, who)
    busy = Job.objects.filter(gate=gate, status__in=UNFINISHED).first()
    if busy is not None:
        raise RunRefused(_("%(gate)s already has a run going (%(run)s, %(status)s); cancel it first")
                         % {"gate": gate.label, "run": str(busy.code)[:8], "status": busy.get_status_display()})
    _require_error_budget(gate)
    site = site or gate.pilot.sites.filter(nodes__role=Node.Role.GPU).distinct().order_by("name").first()
    if site is None:
        raise RunRefused(_("the pilot %(pilot)s has no site with a GPU node; register nodes first")
                         % {"pilot": gate.pilot})
    nodes = list(site.nodes.filter(role=Node.Role.GPU).order_by("name"))
    if not nodes:
        raise RunRefused(_("the site %(site)s has no GPU node") % {"site": site.name})
    actor = lifecycle.as_actor(who)
    params = validate_params(dict(params or {}))
    if all(node.simulated for node in nodes):
        params.setdefault("time_scale", settings.FXPILOT_SIM_TIME_SCALE)
    params.setdefault("time_scale", 1.0)
    job = Job.objects.create(pilot=gate.pilot, gate=gate, site=site, kind=Job.Kind.GATE_RUN, params=params,
                             created_by=actor.user, created_by_label="" if actor.user is not None else actor.name)
    waiting = None
    try:
        # The machines are this run's until it finishes (rolled back with the job if anything below refuses).
        take_nodes(job, nodes)
    except LeaseRefused as exc:
        if not wait:
            raise RunRefused(str(exc)) from None
        waiting = exc
        job.waiting_for, job.waiting_on = exc.waiting[:400], exc.holder
        job.save(update_fields=["waiting_for", "waiting_on"])
    if gate.number == traces.TRACE_GATE:
        uploaded = None
        if not trace:
            try:
                trace, uploaded = traces.trace_for_run(gate)
            except traces.TraceRefused as exc:
                raise RunRefused(str(exc)) from None
        # an uploaded trace was read and checked by its analysis (runners.traces.analyse_row): not again here
        kept = attach_trace(job, trace, checked=uploaded is not None)
        if uploaded is not None:
            # the trace's own file name: the replay and the reports name it (and its format may be read from it)
            job.params = {**job.params, "trace_file": uploaded.name}
            job.save(update_fields=["params"])
            system_line(job, f"G4 replays the customer's trace {uploaded.name} uploaded by "
                             f"{uploaded.uploaded_by or 'the command line'} (sha256 {uploaded.sha256}, "
                             f"{uploaded.sessions} sessions)")
        elif not trace:
            system_line(job, "no customer trace was uploaded and the signed plan allows a sample: G4 replays a "
                             f"generated sample trace ({kept.name}) — not the customer's traffic")
    steps = StepList(job)
    gateplans.build(job, gate, nodes, steps)
    steps.save()
    lifecycle.audit(gate.pilot, who, AuditAction.RUN_STARTED, job, "", job.status, gate=gate.number,
                    steps=len(steps.steps), site=site.name)
    system_line(job, f"{gate.label} run {job.code} created by {actor.name}: {len(steps.steps)} steps on "
                     f"{', '.join(n.name for n in nodes)} (site {site.name}, queue {site.queue})")
    if waiting is not None:
        system_line(job, waiting.waiting)
    transaction.on_commit(lambda: dispatch_advance(job.pk))
    return job


def _require_error_budget(gate: Gate) -> None:
    """A gate's runs share one error budget (judging.runs, default 2; docs/judge.md): once that many runs were
    judged (pass, marginal or fail) the gate is decided and no further run may shop for another verdict."""
    version = gate.pilot.signed_plan
    if version is None:
        return
    allowed = int((version.to_plan().judging or {}).get("runs", sequential.DEFAULT_RUNS))
    judged = set(Evaluation.objects.filter(gate=gate, job__isnull=False).exclude(verdict="invalid")
                 .values_list("job_id", flat=True))
    if len(judged) >= allowed:
        raise RunRefused(_("%(gate)s has had %(runs)d judged run(s), all its plan's error budget allows "
                           "(judging.runs): the gate is decided") % {"gate": gate.label, "runs": len(judged)})


@transaction.atomic
def extend_run(job: Job, evaluate: Step, evaluation, *, first_repetition: int, extra: int = 1) -> int:
    """A marginal verdict with room left: more repetitions (new steps), then a new evaluate; the report moves after it.

    Returns how many steps were added. The verdict is recorded only by the last evaluate.
    """
    last = job.steps.order_by("-seq").values_list("seq", flat=True).first()
    steps = StepList(job, start=last + 1)
    waits = gateplans.extension(job, steps, first_repetition, extra)
    collects = [seq for seq in waits if steps.steps[seq - last - 1].name == "collect"]
    again = steps.add("evaluate", after=[evaluate.seq, *collects], after_done=[s for s in waits if s not in collects],
                      after_evaluation=evaluation.pk)
    steps.save()
    report = job.steps.filter(name="report", status=Status.PENDING).first()
    if report is not None:
        report.params = {**report.params, "after_verdict": [again]}
        report.seq = steps.next_seq
        report.save(update_fields=["params", "seq"])
    last_rep = first_repetition + extra - 1
    which = f"repetition {first_repetition}" if extra == 1 else f"repetitions {first_repetition}–{last_rep}"
    system_line(job, f"the verdict is marginal and the plan's next look is at {last_rep} repetitions: {which} of "
                     f"every cell are measured, then the gate is judged again ({len(steps.steps)} steps added)")
    return len(steps.steps)


def check_trace(data: bytes) -> None:
    """Read the trace as the client will, so a bad CSV is refused at once with the line and column at fault."""
    try:
        validate_trace_size(len(data))
    except ValidationError as exc:
        raise RunRefused(_("the customer trace: %(error)s") % {"error": " ".join(exc.messages)}) from None
    try:
        traces.parse(data, TRACE_NAME)
    except traces.TraceRefused as exc:
        raise RunRefused(_("the customer trace: %(error)s") % {"error": exc}) from None


def attach_trace(job: Job, data: bytes | None, checked: bool = False) -> Artifact:
    """Keep the customer's trace with the run; without one, a generated sample trace that says so. A trace not
    yet `checked` (given to run_gate --trace) is read here, so a bad one is refused before the run exists."""
    if data:
        if not checked:
            check_trace(data)
        return store_bytes(job, TRACE_NAME, data, kind="trace")
    return store_bytes(job, SAMPLE_TRACE_NAME, sample_trace(), kind="trace")


def sample_trace(sessions: int = 24, turns: int = 3, seed: int = 20260629) -> bytes:
    """A made-up multi-turn trace (long shared contexts, short new turns) for demos without a customer trace."""
    rng = random.Random(seed)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["session_id", "turn", "prompt_tokens", "output_tokens", "arrival_offset_s"])
    for s in range(sessions):
        start = rng.uniform(0, 60)
        context = rng.choice([16384, 32768, 65536])
        for turn in range(1, turns + 1):
            writer.writerow([f"sample-{s:03d}", turn, context + 256 * turn, 128, f"{start + 45 * (turn - 1):.1f}"])
    return out.getvalue().encode()
