"""Gate runs: the step list built from the signed plan, and the engine that advances it.

The database is the source of truth; the broker only carries "look at step N". A step is claimed
by a conditional update from `pending`, so two workers never run one step; a detached step (long
remote work) is followed by short polling tasks that each hold a token, and the reconcile sweep
hands a stale step a new token, so at most one polling chain follows a remote process. A step
that finished is never run again.

Dependencies live in `Step.params`: `after` (those steps must be successful), `after_done` (they
must be finished, whatever the outcome), `after_verdict` (successful or failed). `always` steps
(teardown) still run when the job halts, provided one of their dependencies ever started.

Two bad outcomes, never mixed: a step is `failed` only when the stack ran and missed a bar (the
evaluate step on a `fail` verdict) and `error` when the infrastructure broke; the job's `error`
names the step and the reason. Only a failed verdict halts a pilot, through
gates.lifecycle.record_verdict.
"""
from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import F
from django.utils import timezone

from gates import lifecycle
from gates.models import Gate
from runners.models import FINISHED, Artifact, Job, Node, Site, Status, Step
from runners.output import append_output, system_line
from runners.queues import CONTROL_QUEUE, queue_for_step

log = logging.getLogger(__name__)

UNFINISHED = (Status.PENDING, Status.RUNNING)


class TransientError(Exception):
    """Worth another try after a pause (a dropped or refused connection)."""


class StepFailed(Exception):
    """The stack ran and missed a bar: the step (and the job) end `failed`, never `error`."""


class StepError(Exception):
    """The infrastructure broke; the message says what, in words a person can act on."""


# ── Step kinds ─────────────────────────────────────────────────────────────────────────────────


@dataclass
class Poll:
    """What a look at a detached remote process found."""

    running: bool
    exit_code: int | None = None
    requests_done: int | None = None
    requests_total: int | None = None
    output: str = ""
    stderr: str = ""


@dataclass
class StepKind:
    """How one kind of step runs: `run` in one task, or `start` + `poll` + `finish` for detached work."""

    name: str
    run: Callable[[StepContext], dict] | None = None
    start: Callable[[StepContext], dict] | None = None
    poll: Callable[[StepContext], Poll] | None = None
    finish: Callable[[StepContext, Poll], dict] | None = None
    cancel: Callable[[StepContext], None] | None = None
    soft_time_limit: int = 600
    # A report error is shown on its step but does not turn a recorded verdict into an error.
    affects_status: bool = True

    @property
    def detached(self) -> bool:
        return self.start is not None


KINDS: dict[str, StepKind] = {}


def register_kind(kind: StepKind) -> StepKind:
    KINDS[kind.name] = kind
    return kind


def get_kind(name: str) -> StepKind:
    if name not in KINDS:
        import runners.steps  # noqa: F401  (registers the gate-run kinds)
    try:
        return KINDS[name]
    except KeyError:
        raise StepError(f"no step kind named {name!r} is known to this worker") from None


def _known_kind(name: str) -> StepKind:
    """The kind, or defaults where only a worker knows it (a process that dispatches but never runs it)."""
    try:
        return get_kind(name)
    except StepError:
        return StepKind(name)


@dataclass
class StepContext:
    step: Step
    token: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def job(self) -> Job:
        return self.step.job

    @property
    def node(self) -> Node | None:
        return self.step.node

    def log(self, text: str, *, stream: str = "stdout") -> None:
        append_output(self.step.job_id, text, stream=stream, step=self.step)

    def say(self, text: str) -> None:
        system_line(self.step.job_id, text, step=self.step)

    def beat(self, **fields) -> bool:
        """Refresh the heartbeat (and progress fields); False when this worker no longer owns the step."""
        return Step.objects.filter(pk=self.step.pk, status=Status.RUNNING, claimed_by=self.token).update(
            heartbeat=timezone.now(), **fields) == 1

    def save_remote(self, remote: dict) -> None:
        self.step.remote = remote
        Step.objects.filter(pk=self.step.pk, claimed_by=self.token).update(remote=remote, heartbeat=timezone.now())

    def sibling(self, seq: int) -> Step:
        return Step.objects.select_related("node").get(job_id=self.step.job_id, seq=seq)


def step_label(step: Step) -> str:
    arm = f" [{step.arm}]" if step.arm else ""
    where = f" on {step.node.name}" if step.node_id else ""
    return f"step {step.seq} {step.name}{arm}{where}"


# ── Building a gate run ────────────────────────────────────────────────────────────────────────


class StepList:
    """Appends steps to a job in order; each `add` returns the new step's seq for later dependencies."""

    def __init__(self, job: Job, start: int = 1):
        self.job, self.next_seq, self.steps = job, start, []

    def add(self, name: str, *, node: Node | None = None, arm: str = "", after=(), after_done=(), after_verdict=(),
            always: bool = False, requests_total: int = 0, **params) -> int:
        seq = self.next_seq
        self.next_seq += 1
        deps = {"after": list(after), "after_done": list(after_done), "after_verdict": list(after_verdict)}
        params = {**{k: v for k, v in deps.items() if v}, **({"always": True} if always else {}), **params}
        self.steps.append(Step(job=self.job, seq=seq, name=name, node=node, arm=arm, params=params,
                               requests_total=requests_total))
        return seq

    def save(self) -> list[Step]:
        return Step.objects.bulk_create(self.steps)


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
    "time_scale": (_positive_number, "a number above 0"),
    "repetitions": (_positive_int, "a whole number ≥ 1"),
    "concurrency": (_positive_int, "a whole number ≥ 1"),
    "levels": (lambda v: isinstance(v, dict) and bool(v) and all(a in ("fx", "local_nvme", "recompute") and _levels(c)
                                                                   for a, c in v.items()),
               "a mapping of arm (fx, local_nvme, recompute) → list of concurrency levels"),
    "fio_runtime": (lambda v: _positive_int(v) and v <= 3600, "whole seconds, 1–3600"),
    "fio_size": (lambda v: isinstance(v, str) and bool(re.fullmatch(r"\d{1,6}[KMGkmg]?", v)), "a size such as 16M or 4G"),
    "soak_seconds": (_positive_number, "a number of seconds above 0"),
    "workloads": (lambda v: isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()),
                  "a mapping of workload name → settings, as in the plan"),
    "extend_marginal": (lambda v: isinstance(v, bool), "true or false"),
    "language": (lambda v: v in ("en", "zh-hans"), "en or zh-hans"),
    "report_language": (lambda v: v in ("en", "zh-hans"), "en or zh-hans"),
}


def validate_params(params: dict) -> dict:
    """The run's parameters, or RunRefused naming the first bad one and what it accepts."""
    if not isinstance(params, dict):
        raise RunRefused("the run parameters must be a mapping")
    for key, value in params.items():
        if key not in PARAMS:
            raise RunRefused(f"params.{key}: unknown parameter (known: {', '.join(sorted(PARAMS))})")
        check, accepts = PARAMS[key]
        if not check(value):
            raise RunRefused(f"params.{key}: {value!r} is not {accepts}")
    for name, values in (params.get("workloads") or {}).items():
        for field_name, value in values.items():
            if not (_positive_number(value) or _levels(value)):
                raise RunRefused(f"params.workloads.{name}.{field_name}: {value!r} is not a positive number")
    return params


@transaction.atomic
def start_gate_run(gate: Gate, who=None, *, site: Site | None = None, params: dict | None = None,
                   trace: bytes | None = None) -> Job:
    """Create a gate run with its steps and dispatch it once the transaction commits.

    `trace` is the customer's session trace CSV for G4's replay; without one G4 replays a generated
    sample trace and its log says so.
    """
    from runners import gateplans
    from runners.steps import attach_trace

    gate = Gate.objects.select_for_update().select_related("pilot").get(pk=gate.pk)
    lifecycle.require_runnable(gate)
    busy = Job.objects.filter(gate=gate, status__in=UNFINISHED).first()
    if busy is not None:
        raise RunRefused(f"{gate.label} already has a run going ({str(busy.code)[:8]}, {busy.status}); cancel it first")
    site = site or gate.pilot.sites.filter(nodes__role=Node.Role.GPU).distinct().order_by("name").first()
    if site is None:
        raise RunRefused(f"the pilot {gate.pilot} has no site with a GPU node; register nodes first")
    nodes = list(site.nodes.filter(role=Node.Role.GPU).order_by("name"))
    if not nodes:
        raise RunRefused(f"the site {site.name} has no GPU node")
    actor = lifecycle.as_actor(who)
    params = validate_params(dict(params or {}))
    if all(node.simulated for node in nodes):
        params.setdefault("time_scale", settings.FXPILOT_SIM_TIME_SCALE)
    params.setdefault("time_scale", 1.0)
    job = Job.objects.create(pilot=gate.pilot, gate=gate, site=site, kind=Job.Kind.GATE_RUN, params=params,
                             created_by=actor.user)
    if gate.number == 4:
        kept = attach_trace(job, trace)
        if not trace:
            system_line(job, "no customer trace was uploaded: G4 replays a generated sample trace "
                             f"({kept.name}), which is not the customer's traffic")
    steps = StepList(job)
    gateplans.build(job, gate, nodes, steps)
    steps.save()
    lifecycle.audit(gate.pilot, who, "run.started", job, "", job.status, gate=gate.number,
                    steps=len(steps.steps), site=site.name)
    system_line(job, f"{gate.label} run {job.code} created by {actor.name}: {len(steps.steps)} steps on "
                     f"{', '.join(n.name for n in nodes)} (site {site.name}, queue {site.queue})")
    transaction.on_commit(lambda: dispatch_advance(job.pk))
    return job


@transaction.atomic
def extend_run(job: Job, evaluate: Step, evaluation, *, first_repetition: int, extra: int = 1) -> int:
    """A marginal verdict with room left: more repetitions (new steps), then a new evaluate; the report moves after it.

    Returns how many steps were added. The verdict is recorded only by the last evaluate.
    """
    from runners import gateplans

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
    system_line(job, f"the verdict is marginal and the plan allows more repetitions: repetition {first_repetition} "
                     f"of every cell is measured, then the gate is judged again ({len(steps.steps)} steps added)")
    return len(steps.steps)


# ── Dispatch ───────────────────────────────────────────────────────────────────────────────────


def dispatch_advance(job_id: int, countdown: float = 0) -> None:
    from runners import tasks

    tasks.advance_job.apply_async((job_id,), queue=CONTROL_QUEUE, countdown=countdown)


def _dispatch_step(step: Step, countdown: float = 0) -> None:
    from runners import tasks

    kind = _known_kind(step.name)
    queue = queue_for_step(step)
    limit = kind.soft_time_limit
    transaction.on_commit(lambda: tasks.run_step.apply_async(
        (step.pk,), queue=queue, countdown=countdown, soft_time_limit=limit, time_limit=limit + 60))


def _dispatch_poll(step: Step, token: str, countdown: float) -> None:
    from runners import tasks

    queue = queue_for_step(step)
    transaction.on_commit(lambda: tasks.poll_step.apply_async((step.pk, token), queue=queue, countdown=countdown))


def _dispatch_cancel(step: Step) -> None:
    from runners import tasks

    queue = queue_for_step(step)
    transaction.on_commit(lambda: tasks.cancel_step.apply_async((step.pk,), queue=queue))


def _stale_before() -> datetime:
    return timezone.now() - timedelta(seconds=settings.FXPILOT_STALE_SECONDS)


# ── Advancing a job ────────────────────────────────────────────────────────────────────────────


def _halting(job: Job) -> bool:
    return job.cancel_requested or bool(job.error)


def _readiness(step: Step, by_seq: dict[int, Step], halting: bool) -> str:
    """'ready', 'wait' or 'never' (a dependency ended so that this step can no longer run)."""
    params = step.params or {}
    groups = (
        (params.get("after", []), (Status.SUCCESSFUL,)),
        (params.get("after_verdict", []), (Status.SUCCESSFUL, Status.FAILED)),
        (params.get("after_done", []), FINISHED),
    )
    deps = [by_seq[seq] for seqs, _ in groups for seq in seqs]
    if halting and not params.get("always"):
        return "never"
    if params.get("always") and deps and all(d.status in FINISHED for d in deps) and not any(d.started for d in deps):
        return "never"  # nothing it would clean up ever started
    for seqs, accepted in groups:
        for seq in seqs:
            dep = by_seq[seq]
            if dep.status in FINISHED and dep.status not in accepted:
                return "never"
            if dep.status not in FINISHED:
                return "wait"
    return "ready"


def advance(job_id: int) -> Job:
    """Dispatch every step that may run now, stop what a halt stops, and close the job when all is done."""
    job = Job.objects.get(pk=job_id)
    if job.is_finished:
        return job
    steps = list(job.steps.select_related("node__site").order_by("seq"))
    by_seq = {step.seq: step for step in steps}
    halting = _halting(job)
    stale = _stale_before()
    for step in steps:
        if step.status == Status.PENDING:
            state = _readiness(step, by_seq, halting)
            if state == "never":
                why = "canceled" if job.cancel_requested else "skipped: the run stopped before it" if halting else \
                    "skipped: a step it needs did not succeed"
                if Step.objects.filter(pk=step.pk, status=Status.PENDING).update(
                        status=Status.CANCELED, finished=timezone.now(), error=why):
                    step.status = Status.CANCELED
            elif state == "ready" and (step.heartbeat is None or step.heartbeat < stale):
                # The heartbeat of a pending step is its last dispatch; only the update's winner sends it.
                if Step.objects.filter(pk=step.pk, status=Status.PENDING, heartbeat=step.heartbeat).update(
                        heartbeat=timezone.now()):
                    _dispatch_step(step)
        elif step.status == Status.RUNNING and halting and not step.params.get("always") and step.remote.get("pid"):
            _dispatch_cancel(step)
    if all(step.status in FINISHED for step in steps):
        _close(job, steps)
    return job


def _close(job: Job, steps: list[Step]) -> None:
    if job.cancel_requested:
        status = Status.CANCELED
    elif any(s.status == Status.ERROR and _known_kind(s.name).affects_status for s in steps):
        status = Status.ERROR
    elif any(s.status == Status.FAILED for s in steps):
        status = Status.FAILED
    else:
        status = Status.SUCCESSFUL
    now = timezone.now()
    if Job.objects.filter(pk=job.pk, status__in=UNFINISHED).update(status=status, finished=now,
                                                                    started=job.started or now):
        job.refresh_from_db()
        detail = f": {job.error}" if status == Status.ERROR and job.error else ""
        system_line(job, f"run {status}{detail}")
        lifecycle.audit(job.pilot, "orchestrator", "run.finished", job, Status.RUNNING, status,
                        error=job.error if status == Status.ERROR else "")


# ── Running a step ─────────────────────────────────────────────────────────────────────────────


def new_token(worker: str) -> str:
    return f"{worker}#{uuid.uuid4().hex[:10]}"


class _Heartbeat(threading.Thread):
    """Keeps a claimed step's heartbeat fresh while a synchronous handler works; dies with its worker."""

    def __init__(self, step_id: int, token: str):
        super().__init__(daemon=True, name=f"heartbeat-{step_id}")
        self.step_id, self.token = step_id, token
        self.stopped = threading.Event()

    def run(self) -> None:
        every = max(0.2, settings.FXPILOT_STALE_SECONDS / 4)
        try:
            while not self.stopped.wait(every):
                Step.objects.filter(pk=self.step_id, status=Status.RUNNING, claimed_by=self.token).update(
                    heartbeat=timezone.now())
        finally:
            connections.close_all()

    def __enter__(self) -> _Heartbeat:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.join(timeout=5)


def execute_step(step_id: int, worker: str) -> str:
    """Claim a pending step and run it (or start its remote process). Returns what happened, for logs."""
    step = Step.objects.select_related("job", "node__site").filter(pk=step_id).first()
    if step is None or step.status != Status.PENDING:
        return "not pending"
    job = step.job
    by_seq = {s.seq: s for s in job.steps.all()}
    if _readiness(step, by_seq, _halting(job)) != "ready":
        # Forget this dispatch, so the step is sent again as soon as it may run.
        Step.objects.filter(pk=step.pk, status=Status.PENDING).update(heartbeat=None)
        dispatch_advance(job.pk)
        return "not ready"
    token = new_token(worker)
    now = timezone.now()
    claimed = Step.objects.filter(pk=step.pk, status=Status.PENDING).update(
        status=Status.RUNNING, claimed_by=token, heartbeat=now, started=now, attempts=F("attempts") + 1)
    if claimed != 1:
        return "claimed elsewhere"
    Job.objects.filter(pk=job.pk, status=Status.PENDING).update(status=Status.RUNNING, started=now)
    step.refresh_from_db()
    kind = get_kind(step.name)
    ctx = StepContext(step, token)
    ctx.say(f"{step_label(step)} started (attempt {step.attempts}, {worker})")
    if step.attempts > 1 and not kind.detached:
        # An unfinished attempt's evidence is dropped so the new attempt's own files take its names
        # (the bytes stay in the content-addressed store; the judge never saw them).
        Artifact.objects.filter(job_id=job.pk, step=step).delete()
    try:
        if kind.detached:
            with _Heartbeat(step.pk, token):
                remote = kind.start(ctx)
            ctx.save_remote(remote)
            _dispatch_poll(step, token, settings.FXPILOT_POLL_SECONDS)
            return "started"
        with _Heartbeat(step.pk, token):
            result = kind.run(ctx)
        _finish(step, token, Status.SUCCESSFUL, result=result or {})
    except Exception as exc:  # noqa: BLE001 — every outcome of a step is recorded, none escapes
        _handle_exception(step, token, kind, exc)
    dispatch_advance(job.pk)
    return "ran"


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, TransientError):
        return True
    from runners import ssh

    return ssh.is_transient(exc)


def _describe(exc: BaseException) -> str:
    from celery.exceptions import SoftTimeLimitExceeded

    if isinstance(exc, SoftTimeLimitExceeded):
        return "took longer than its time limit and was stopped"
    text = str(exc).strip() or type(exc).__name__
    return text if isinstance(exc, (StepError, StepFailed, TransientError)) else f"{type(exc).__name__}: {text}"


def _handle_exception(step: Step, token: str, kind: StepKind, exc: BaseException) -> None:
    if isinstance(exc, StepFailed):
        _finish(step, token, Status.FAILED, error=_describe(exc))
        return
    if _is_transient(exc) and step.attempts < settings.FXPILOT_STEP_MAX_ATTEMPTS:
        backoff = min(300.0, settings.FXPILOT_POLL_SECONDS * 2 ** step.attempts)
        # Back to pending with its "last dispatch" set to when the retry is due, so the sweep waits for it.
        due = timezone.now() + timedelta(seconds=backoff)
        if Step.objects.filter(pk=step.pk, status=Status.RUNNING, claimed_by=token).update(
                status=Status.PENDING, claimed_by="", heartbeat=due):
            system_line(step.job_id, f"{step_label(step)}: {_describe(exc)} — retrying in {backoff:.1f} s "
                                     f"(attempt {step.attempts} of {settings.FXPILOT_STEP_MAX_ATTEMPTS})", step=step)
            _dispatch_step(step, countdown=backoff)
        return
    if not isinstance(exc, (StepError, TransientError)):
        log.exception("%s raised", step_label(step))
    _finish(step, token, Status.ERROR, error=_describe(exc), affects_status=kind.affects_status)


def _finish(step: Step, token: str, status: str, *, result: dict | None = None, error: str = "",
            affects_status: bool = True) -> bool:
    job = Job.objects.get(pk=step.job_id)
    if status == Status.ERROR and _halting(job) and job.cancel_requested:
        status, error = Status.CANCELED, f"canceled ({error})" if error else "canceled"
    fields = {"status": status, "finished": timezone.now(), "heartbeat": timezone.now(), "error": error}
    if result is not None:
        fields["result"] = result
    if Step.objects.filter(pk=step.pk, status=Status.RUNNING, claimed_by=token).update(**fields) != 1:
        return False
    label = step_label(step)
    if status == Status.ERROR:
        system_line(step.job_id, f"{label} error: {error}", step=step)
        if affects_status:
            Job.objects.filter(pk=step.job_id, error="").update(error=f"{label}: {error}")
    elif status == Status.FAILED:
        system_line(step.job_id, f"{label} failed: {error}", step=step)
    else:
        system_line(step.job_id, f"{label} {status}", step=step)
    return True


def poll_step(step_id: int, token: str) -> str:
    """One look at a detached step's remote process; schedules the next look or closes the step."""
    step = Step.objects.select_related("job", "node__site").filter(pk=step_id).first()
    if step is None or step.status != Status.RUNNING or step.claimed_by != token:
        return "not mine"
    kind = get_kind(step.name)
    ctx = StepContext(step, token)
    interval = settings.FXPILOT_POLL_SECONDS
    try:
        found = kind.poll(ctx)
    except Exception as exc:  # noqa: BLE001
        if not _is_transient(exc):
            reason = _describe(exc) if isinstance(exc, StepError) else f"following the remote process: {_describe(exc)}"
            _finish(step, token, Status.ERROR, error=reason, affects_status=kind.affects_status)
            dispatch_advance(step.job_id)
            return "error"
        failures = int(step.remote.get("poll_failures", 0)) + 1
        limit = max(settings.FXPILOT_STEP_MAX_ATTEMPTS * 3, 6)
        if failures > limit:
            where = step.node.name if step.node_id else "the node"
            _finish(step, token, Status.ERROR, error=f"lost contact with {where} "
                                                      f"({failures} polls in a row failed): {_describe(exc)}")
            dispatch_advance(step.job_id)
            return "error"
        ctx.save_remote({**step.remote, "poll_failures": failures})
        system_line(step.job_id, f"{step_label(step)}: {_describe(exc)} — will re-attach", step=step)
        _dispatch_poll(step, token, min(60.0, interval * 2 ** min(failures, 6)))
        return "retry"
    if step.remote.get("poll_failures"):
        ctx.save_remote({k: v for k, v in step.remote.items() if k != "poll_failures"})
        system_line(step.job_id, f"{step_label(step)}: re-attached to the remote process", step=step)
    progress = {}
    if found.requests_done is not None:
        progress["requests_done"] = found.requests_done
    if found.requests_total:
        progress["requests_total"] = found.requests_total
    if not ctx.beat(**progress):
        return "not mine"
    if found.output:
        ctx.log(found.output)
    if found.stderr:
        ctx.log(found.stderr, stream="stderr")
    if found.running:
        _dispatch_poll(step, token, interval)
        return "running"
    try:
        result = kind.finish(ctx, found) if kind.finish else {"exit_code": found.exit_code}
        _finish(step, token, Status.SUCCESSFUL, result=result or {})
    except Exception as exc:  # noqa: BLE001
        _handle_finish_exception(step, token, kind, exc)
    dispatch_advance(step.job_id)
    return "finished"


def _handle_finish_exception(step: Step, token: str, kind: StepKind, exc: BaseException) -> None:
    if isinstance(exc, StepFailed):
        _finish(step, token, Status.FAILED, error=_describe(exc))
    else:
        if not isinstance(exc, (StepError, TransientError)):
            log.exception("%s raised while finishing", step_label(step))
        _finish(step, token, Status.ERROR, error=_describe(exc), affects_status=kind.affects_status)


def cancel_step(step_id: int) -> str:
    """Kill a running step's remote process group, then mark it canceled (a halted or canceled run)."""
    step = Step.objects.select_related("job", "node__site").filter(pk=step_id).first()
    if step is None or step.status != Status.RUNNING:
        return "not running"
    kind = get_kind(step.name)
    if kind.cancel is not None and step.remote:
        kind.cancel(StepContext(step, step.claimed_by))
    why = "canceled" if step.job.cancel_requested else "stopped: the run halted on an error elsewhere"
    if Step.objects.filter(pk=step.pk, status=Status.RUNNING).update(
            status=Status.CANCELED, finished=timezone.now(), error=why):
        system_line(step.job_id, f"{step_label(step)} {why}; its remote processes were killed", step=step)
    dispatch_advance(step.job_id)
    return "canceled"


# ── Reconcile, cancel ──────────────────────────────────────────────────────────────────────────


def reconcile(stale_seconds: float | None = None) -> dict[str, int]:
    """Resume what a dead worker left: stale running steps, lost dispatches, jobs that could close.

    A detached step whose remote process started is re-polled (never restarted); any other stale
    running step goes back to pending and is claimed again (its handler is idempotent).
    """
    seconds = stale_seconds if stale_seconds is not None else settings.FXPILOT_STALE_SECONDS
    stale = timezone.now() - timedelta(seconds=seconds)
    counts = {"repolled": 0, "requeued": 0, "gave_up": 0, "jobs": 0}
    for step in Step.objects.select_related("job", "node__site").filter(
            status=Status.RUNNING, job__status__in=UNFINISHED, heartbeat__lt=stale):
        kind = _known_kind(step.name)
        if step.remote.get("pid"):  # a detached process was started: follow it, never start it again
            token = new_token("reconcile")
            if Step.objects.filter(pk=step.pk, status=Status.RUNNING, heartbeat=step.heartbeat).update(
                    claimed_by=token, heartbeat=timezone.now()):
                system_line(step.job_id, f"{step_label(step)}: its worker went silent; following the remote "
                                         "process again", step=step)
                _dispatch_poll(step, token, 0)
                counts["repolled"] += 1
        elif step.attempts >= settings.FXPILOT_STEP_MAX_ATTEMPTS:
            if _finish(step, step.claimed_by, Status.ERROR, error=f"its worker died {step.attempts} times; giving up",
                       affects_status=kind.affects_status):
                counts["gave_up"] += 1
        elif Step.objects.filter(pk=step.pk, status=Status.RUNNING, heartbeat=step.heartbeat).update(
                status=Status.PENDING, claimed_by="", heartbeat=None):
            system_line(step.job_id, f"{step_label(step)}: its worker went silent before it finished; running it again",
                        step=step)
            counts["requeued"] += 1
    for job_id in Job.objects.filter(status__in=UNFINISHED).values_list("pk", flat=True):
        with transaction.atomic():
            advance(job_id)
        counts["jobs"] += 1
    return counts


def request_cancel(job: Job, who=None) -> Job:
    """Stop dispatching, kill the run's remote process groups, run teardown, end `canceled`."""
    with transaction.atomic():
        mine = Job.objects.filter(pk=job.pk, status__in=UNFINISHED, cancel_requested=False)
        if not mine.update(cancel_requested=True):
            job.refresh_from_db()
            return job
        job.refresh_from_db()
        actor = lifecycle.as_actor(who)
        lifecycle.audit(job.pilot, who, "run.cancel_requested", job, job.status, job.status)
        system_line(job, f"cancel requested by {actor.name}: stopping dispatch, killing remote processes, tearing down")
        for step in job.steps.select_related("node__site").filter(status=Status.RUNNING):
            if step.remote.get("pid") and not step.params.get("always"):
                _dispatch_cancel(step)
        transaction.on_commit(lambda: dispatch_advance(job.pk))
    return job


# ── Progress ───────────────────────────────────────────────────────────────────────────────────


def job_progress(job: Job) -> dict[str, Any]:
    """Step n of N, requests done of total, an estimate of the time left, and where the live log stands."""
    steps = list(job.steps.select_related("node").order_by("seq"))
    total = len(steps)
    finished = sum(1 for s in steps if s.status in FINISHED)
    running = [s for s in steps if s.status == Status.RUNNING]
    done_requests = sum(s.requests_done for s in steps)
    total_requests = sum(max(s.requests_total, s.requests_done) for s in steps)
    fraction = 0.0
    if total:
        partial = sum(min(1.0, s.requests_done / s.requests_total) for s in running if s.requests_total)
        fraction = min(1.0, (finished + partial) / total)
    elapsed = None
    eta = None
    if job.started:
        end = job.finished or timezone.now()
        elapsed = max(0.0, (end - job.started).total_seconds())
        if not job.is_finished and fraction > 0:
            eta = elapsed * (1 - fraction) / fraction

    return {
        "job": str(job.code),
        "status": job.status,
        "cancel_requested": job.cancel_requested,
        "error": job.error,
        "step": min(finished + 1, total),
        "steps_total": total,
        "steps_finished": finished,
        "current": [
            {"seq": s.seq, "name": s.name, "arm": s.arm, "node": s.node.name if s.node_id else "",
             "requests_done": s.requests_done, "requests_total": s.requests_total}
            for s in running
        ],
        "requests_done": done_requests,
        "requests_total": total_requests,
        "fraction": round(fraction, 4),
        "elapsed_seconds": elapsed,
        "eta_seconds": None if eta is None else round(eta, 1),
        "log_chunks": job.chunk_count,
        "steps": [
            {"seq": s.seq, "name": s.name, "arm": s.arm, "node": s.node.name if s.node_id else "", "status": s.status,
             "attempts": s.attempts, "requests_done": s.requests_done, "requests_total": s.requests_total,
             "error": s.error}
            for s in steps
        ],
    }


def log_since(job: Job, after_seq: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
    """Live log chunks numbered after `after_seq`, for back-fill without gaps."""
    return [
        {"seq": c.seq, "stream": c.stream, "text": c.text, "step": c.step_id, "created": c.created.isoformat()}
        for c in job.chunks.filter(seq__gt=after_seq).order_by("seq")[:limit]
    ]


def wait_for(job: Job, timeout: float, *, on_tick: Callable[[Job], None] | None = None, every: float = 0.5) -> Job:
    """Block until the job finishes or the timeout passes (commands and tests)."""
    deadline = time.monotonic() + timeout
    while True:
        job.refresh_from_db()
        if on_tick:
            on_tick(job)
        if job.is_finished or time.monotonic() > deadline:
            return job
        time.sleep(every)


__all__ = [
    "KINDS", "Poll", "RunRefused", "StepContext", "StepError", "StepFailed", "StepKind", "StepList", "TransientError",
    "advance", "cancel_step", "execute_step", "get_kind", "job_progress", "log_since", "poll_step", "reconcile",
    "register_kind", "request_cancel", "start_gate_run", "step_label", "wait_for",
]
