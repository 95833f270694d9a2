"""The engine: advance a gate run's steps, claim and run one step, follow a detached one, reconcile, cancel.

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
names the step and the reason.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import datetime, timedelta

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.db.models import F
from django.utils import timezone

from gates import lifecycle, policy
from gates.models import AuditAction
from runners import ssh, traces
from runners.dispatch import dispatch_advance, dispatch_cancel, dispatch_poll, dispatch_step
from runners.kinds import StepContext, StepError, StepFailed, StepKind, TransientError, get_kind, known_kind, step_label
from runners.models import (
    FINISHED,
    UNFINISHED,
    Artifact,
    Job,
    LeaseRefused,
    Node,
    Status,
    Step,
    job_nodes,
    release_nodes,
    take_nodes,
)
from runners.output import system_line

log = logging.getLogger(__name__)


def _stale_before() -> datetime:
    return timezone.now() - timedelta(seconds=settings.FXPILOT_STALE_SECONDS)


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
    halting = _halting(job)
    if job.waiting_for and not halting and not _take_waited_nodes(job):
        return job
    steps = list(job.steps.select_related("node__site").order_by("seq"))
    by_seq = {step.seq: step for step in steps}
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
                    dispatch_step(step)
        elif step.status == Status.RUNNING and halting and not step.params.get("always") and step.remote.get("pid"):
            dispatch_cancel(step)
    if all(step.status in FINISHED for step in steps):
        _close(job, steps)
    return job


def _take_waited_nodes(job: Job) -> bool:
    """A waiting run takes its nodes if they are free now (True), else it says what it still waits for.

    Called by every advance: the holding run's close wakes its waiters, and the reconcile sweep advances
    every unfinished run, so a waiting run starts without anything polling for it.
    """
    with transaction.atomic():
        locked = Job.objects.select_for_update().filter(pk=job.pk, status=Status.PENDING).first()
        if locked is None or not locked.waiting_for:
            return True
        try:
            take_nodes(locked, job_nodes(locked))
        except LeaseRefused as exc:
            line = exc.waiting[:400]
            if line != locked.waiting_for or exc.holder != locked.waiting_on:
                Job.objects.filter(pk=job.pk).update(waiting_for=line, waiting_on=exc.holder)
                system_line(job, exc.waiting)
            return False
        Job.objects.filter(pk=job.pk).update(waiting_for="", waiting_on=None)
    job.waiting_for, job.waiting_on = "", None
    system_line(job, "its nodes are free now: the run starts")
    return True


def _close(job: Job, steps: list[Step]) -> None:
    if job.cancel_requested:
        status = Status.CANCELED
    elif any(s.status == Status.ERROR and known_kind(s.name).affects_status for s in steps):
        status = Status.ERROR
    elif any(s.status == Status.FAILED for s in steps):
        status = Status.FAILED
    else:
        status = Status.SUCCESSFUL
    now = timezone.now()
    if Job.objects.filter(pk=job.pk, status__in=UNFINISHED).update(status=status, finished=now,
                                                                    started=job.started or now, waiting_for="",
                                                                    waiting_on=None):
        job.refresh_from_db()
        released = release_nodes(job)
        # Runs waiting for these nodes look again as soon as this commits (the sweep would, later).
        for waiter in Job.objects.filter(waiting_on=job, status=Status.PENDING).values_list("pk", flat=True):
            transaction.on_commit(lambda waiter=waiter: dispatch_advance(waiter))
        detail = f": {job.error}" if status == Status.ERROR and job.error else ""
        system_line(job, f"run {status}{detail}" + (" (its nodes are free again)" if released else ""))
        lifecycle.audit(job.pilot, "orchestrator", AuditAction.RUN_FINISHED, job, Status.RUNNING, status,
                        error=job.error if status == Status.ERROR else "")


# ── Running a step ─────────────────────────────────────────────────────────────────────────────


def new_token(worker: str) -> str:
    return f"{worker}#{uuid.uuid4().hex[:10]}"


CANCEL_LOOK_SECONDS = 1.0   # how often a synchronous step's heartbeat looks for a cancel of its run


class _Heartbeat(threading.Thread):
    """Keeps a claimed step's heartbeat fresh while a synchronous handler works; dies with its worker.

    With `job_id` it also looks for a cancel of the run every CANCEL_LOOK_SECONDS: then the SSH command the
    handler waits on is interrupted (runners.ssh.interruptible), so a deploy waiting for /health, a probe's fio
    or an attach script stops within a second or two instead of running to its end.
    """

    def __init__(self, step_id: int, token: str, job_id: int | None = None):
        super().__init__(daemon=True, name=f"heartbeat-{step_id}")
        self.step_id, self.token, self.job_id = step_id, token, job_id
        self.stopped = threading.Event()
        self.canceled = threading.Event()
        self._interrupt = None

    def run(self) -> None:
        every = max(0.2, settings.FXPILOT_STALE_SECONDS / 4)
        look = min(every, CANCEL_LOOK_SECONDS) if self.job_id is not None else every
        beaten = time.monotonic()
        try:
            while not self.stopped.wait(look):
                try:
                    if self.job_id is not None and not self.canceled.is_set() and Job.objects.filter(
                            pk=self.job_id, cancel_requested=True).exists():
                        self.canceled.set()
                    if time.monotonic() - beaten >= every - 0.01:
                        beaten = time.monotonic()
                        Step.objects.filter(pk=self.step_id, status=Status.RUNNING, claimed_by=self.token).update(
                            heartbeat=timezone.now())
                except DatabaseError:
                    # The database went away (a restart): the step is still alive, so keep beating once it
                    # is back, or the sweep would call the step dead and run it a second time.
                    connections.close_all()
        finally:
            connections.close_all()

    def __enter__(self) -> _Heartbeat:
        if self.job_id is not None:
            self._interrupt = ssh.interruptible(self.canceled, "the run was canceled")
            self._interrupt.__enter__()
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.join(timeout=5)
        if self._interrupt is not None:
            self._interrupt.__exit__(None, None, None)


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
    claimable = Step.objects.filter(pk=step.pk, status=Status.PENDING)
    if not step.params.get("always"):
        # A cancel that lands between the look above and this claim: the claim fails, nothing starts.
        claimable = claimable.filter(job__cancel_requested=False)
    claimed = claimable.update(status=Status.RUNNING, claimed_by=token, heartbeat=now, started=now,
                               attempts=F("attempts") + 1)
    if claimed != 1:
        if Job.objects.filter(pk=job.pk, cancel_requested=True).exists():
            dispatch_advance(job.pk)  # the advance marks it canceled
            return "canceled before it was claimed"
        return "claimed elsewhere"
    Job.objects.filter(pk=job.pk, status=Status.PENDING).update(status=Status.RUNNING, started=now)
    step.refresh_from_db()
    kind = get_kind(step.name)
    ctx = StepContext(step, token)
    ctx.say(f"{step_label(step)} started (attempt {step.attempts}, {worker})")
    if step.attempts > 1 and not kind.detached:
        _set_aside_earlier_attempt(job, step)
    try:
        if kind.detached:
            with _Heartbeat(step.pk, token):
                remote = kind.start(ctx)
            ctx.save_remote(remote)
            if _stop_reason(step):
                # A cancel (or a halt) landed while the process was being started: its pid is known now, so it
                # is killed at once rather than left running until the end of its work.
                return _cancel_now(step, token)
            dispatch_poll(step, token, settings.FXPILOT_POLL_SECONDS)
            return "started"
        with _Heartbeat(step.pk, token, None if step.params.get("always") else job.pk):
            result = kind.run(ctx)
        _finish(step, token, Status.SUCCESSFUL, result=result or {})
    except Exception as exc:  # noqa: BLE001 — every outcome of a step is recorded, none escapes
        _handle_exception(step, token, kind, exc)
    dispatch_advance(job.pk)
    return "ran"


SUPERSEDED = "superseded"


def _set_aside_earlier_attempt(job: Job, step: Step) -> None:
    """An unfinished attempt's files make room for the new attempt's, which take their names; they stay listed
    (renamed under `attempt-N/`, outcome `superseded`, never judged), so nothing collected is lost even when the
    new attempt cannot reach the node."""
    earlier = step.attempts - 1
    for artifact in Artifact.objects.filter(job_id=job.pk, step=step).exclude(outcome=SUPERSEDED):
        artifact.name = f"attempt-{earlier}/{artifact.name}"[:200]
        artifact.outcome = SUPERSEDED
        artifact.save(update_fields=["name", "outcome"])


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TransientError) or ssh.is_transient(exc)


def _describe(exc: BaseException) -> str:
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
            dispatch_step(step, countdown=backoff)
        return
    if not isinstance(exc, (StepError, TransientError)):
        log.exception("%s raised", step_label(step))
    _finish(step, token, Status.ERROR, error=_describe(exc), affects_status=kind.affects_status)


def _finish(step: Step, token: str, status: str, *, result: dict | None = None, error: str = "",
            affects_status: bool = True) -> bool:
    job = Job.objects.get(pk=step.job_id)
    if status == Status.ERROR and _halting(job) and job.cancel_requested and not (step.params or {}).get("always"):
        # What a cancel stopped ended because of the cancel. A teardown is not stopped by a cancel: its
        # failure (a node it could not reach) stays an error, so nobody takes what it left for cleaned up.
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
    if _stop_reason(step):
        # Every look first asks whether the run still wants this work: a cancel whose own message was lost or
        # came before the pid was recorded lands here, at the latest one poll interval later.
        return _cancel_now(step, token)
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
        return _lost_contact(step, token, kind, ctx, exc)
    if step.remote.get("poll_failures"):
        lost = _lost_for(step)
        ctx.save_remote({k: v for k, v in step.remote.items() if k not in LOST_KEYS})
        system_line(step.job_id, f"{step_label(step)}: re-attached to the remote process after "
                                 f"{lost:.0f} s without contact", step=step)
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
        dispatch_poll(step, token, interval)
        return "running"
    try:
        result = kind.finish(ctx, found) if kind.finish else {"exit_code": found.exit_code}
        _finish(step, token, Status.SUCCESSFUL, result=result or {})
    except Exception as exc:  # noqa: BLE001
        _handle_finish_exception(step, token, kind, exc)
    dispatch_advance(step.job_id)
    return "finished"


LOST_KEYS = ("poll_failures", "lost_since", "lost_said")
LOST_SAY_EVERY_S = 60.0  # while a node stays unreachable, the live log says so this often (not at every look)


def step_deadline(step: Step, kind: StepKind) -> datetime:
    """When a detached step's remote work may have ended at the latest: its start + its kind's max_seconds (or
    FXPILOT_STEP_DEADLINE_SECONDS). Until then an unreachable node is looked for again, never given up on."""
    seconds = kind.max_seconds(step) if kind.max_seconds is not None else None
    seconds = float(seconds) if seconds else float(settings.FXPILOT_STEP_DEADLINE_SECONDS)
    return (step.started or timezone.now()) + timedelta(seconds=seconds)


def _lost_for(step: Step) -> float:
    since = step.remote.get("lost_since")
    if not since:
        return 0.0
    return max(0.0, (timezone.now() - datetime.fromisoformat(since)).total_seconds())


def _lost_contact(step: Step, token: str, kind: StepKind, ctx: StepContext, exc: BaseException) -> str:
    """A look failed for a reason a retry may cure (the node or the network is away): the remote process may still
    be running, so it is looked for again — every few seconds at most (FXPILOT_REATTACH_MAX_SECONDS, the back-off
    starts at the poll interval) — for as long as the step's deadline allows. Only past it is the step an error."""
    now = timezone.now()
    failures = int(step.remote.get("poll_failures", 0)) + 1
    since = step.remote.get("lost_since") or now.isoformat()
    lost = max(0.0, (now - datetime.fromisoformat(since)).total_seconds())
    deadline = step_deadline(step, kind)
    where = step.node.name if step.node_id else "the node"
    if now >= deadline:
        _finish(step, token, Status.ERROR, error=(
            f"lost contact with {where} for {lost:.0f} s ({failures} looks in a row failed) and the step's deadline "
            f"({(deadline - (step.started or now)).total_seconds():.0f} s after its start) has passed: "
            f"{_describe(exc)}; its remote process may still be running: teardown stops it"),
            affects_status=kind.affects_status)
        dispatch_advance(step.job_id)
        return "error"
    interval = settings.FXPILOT_POLL_SECONDS
    delay = min(settings.FXPILOT_REATTACH_MAX_SECONDS, interval * 2 ** min(failures - 1, 16),
                max((deadline - now).total_seconds(), 0.05))
    delay = max(delay, min(interval, settings.FXPILOT_REATTACH_MAX_SECONDS))
    said = step.remote.get("lost_said")
    say = failures == 1 or said is None or lost - float(said) >= LOST_SAY_EVERY_S
    ctx.save_remote({**step.remote, "poll_failures": failures, "lost_since": since,
                     "lost_said": lost if say else said})
    if say:
        left = (deadline - now).total_seconds()
        system_line(step.job_id, f"{step_label(step)}: {_describe(exc)} — will re-attach (no contact for "
                                 f"{lost:.0f} s; looking again every {delay:.1f} s at most, for up to {left:.0f} s "
                                 "more, the step's deadline)", step=step)
    dispatch_poll(step, token, delay)
    return "retry"


def _handle_finish_exception(step: Step, token: str, kind: StepKind, exc: BaseException) -> None:
    if isinstance(exc, StepFailed):
        _finish(step, token, Status.FAILED, error=_describe(exc))
    else:
        if not isinstance(exc, (StepError, TransientError)):
            log.exception("%s raised while finishing", step_label(step))
        _finish(step, token, Status.ERROR, error=_describe(exc), affects_status=kind.affects_status)


def _stop_reason(step: Step) -> str:
    """"canceled" or "halted" when the run no longer wants this (not `always`) step's work; "" otherwise."""
    if (step.params or {}).get("always"):
        return ""
    state = Job.objects.filter(pk=step.job_id).values("cancel_requested", "error").first() or {}
    return "canceled" if state.get("cancel_requested") else "halted" if state.get("error") else ""


def _cancel_now(step: Step, token: str) -> str:
    """Cancel a detached step from its own worker; a node that cannot be reached yet is tried again at the next
    poll (the step stays running under its token, so nothing else adopts or restarts it meanwhile)."""
    try:
        return cancel_step(step.pk)
    except Exception as exc:  # noqa: BLE001 — the kill must be tried again, not dropped
        if _is_transient(exc) and timezone.now() < step_deadline(step, known_kind(step.name)):
            system_line(step.job_id, f"{step_label(step)}: the cancel could not kill its remote process yet "
                                     f"({_describe(exc)}); trying again", step=step)
            dispatch_poll(step, token, settings.FXPILOT_POLL_SECONDS)
            return "cancel retry"
        # A node that will not let us in (a changed host key) or is still away at the step's deadline: the step
        # ends canceled saying what may be left; teardown tries the node again and is an error if it cannot.
        why = f"canceled, but its remote process could not be killed: {_describe(exc)}"
        if Step.objects.filter(pk=step.pk, status=Status.RUNNING).update(status=Status.CANCELED,
                                                                        finished=timezone.now(), error=why):
            system_line(step.job_id, f"{step_label(step)} {why}", step=step)
        dispatch_advance(step.job_id)
        return "canceled"


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
    """Resume what a dead worker left: stale running steps, lost dispatches, jobs that could close, and trace
    analyses whose message or worker was lost (runners.traces.requeue_stale).

    A detached step whose remote process started is re-polled (never restarted); any other stale
    running step goes back to pending and is claimed again (its handler is idempotent).
    """
    seconds = stale_seconds if stale_seconds is not None else settings.FXPILOT_STALE_SECONDS
    stale = timezone.now() - timedelta(seconds=seconds)
    counts = {"repolled": 0, "requeued": 0, "gave_up": 0, "jobs": 0}
    for step in Step.objects.select_related("job", "node__site").filter(
            status=Status.RUNNING, job__status__in=UNFINISHED, heartbeat__lt=stale):
        kind = known_kind(step.name)
        if step.remote.get("pid"):  # a detached process was started: follow it, never start it again
            token = new_token("reconcile")
            if Step.objects.filter(pk=step.pk, status=Status.RUNNING, heartbeat=step.heartbeat).update(
                    claimed_by=token, heartbeat=timezone.now()):
                system_line(step.job_id, f"{step_label(step)}: its worker went silent; following the remote "
                                         "process again", step=step)
                dispatch_poll(step, token, 0)
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
    counts["traces"] = traces.requeue_stale()
    return counts


def request_cancel(job: Job, who=None) -> Job:
    """Stop dispatching, kill the run's remote process groups, run teardown, end `canceled`.

    A person must be allowed to (gates.policy, CANCEL_RUN); for anyone, a run already ended or already being
    canceled is left as it is.
    """
    roles = policy.actor_roles(job.pilot, who)
    if roles is not None:
        policy.require(policy.Act.CANCEL_RUN, job, roles)
    with transaction.atomic():
        mine = Job.objects.filter(pk=job.pk, status__in=UNFINISHED, cancel_requested=False)
        if not mine.update(cancel_requested=True):
            job.refresh_from_db()
            return job
        job.refresh_from_db()
        actor = lifecycle.as_actor(who)
        lifecycle.audit(job.pilot, who, AuditAction.RUN_CANCEL_REQUESTED, job, job.status, job.status)
        system_line(job, f"cancel requested by {actor.name}: stopping dispatch, killing remote processes, tearing down")
        for step in job.steps.select_related("node__site").filter(status=Status.RUNNING):
            if step.remote.get("pid") and not step.params.get("always"):
                dispatch_cancel(step)
        transaction.on_commit(lambda: dispatch_advance(job.pk))
    return job


# ── Contacting a node ──────────────────────────────────────────────────────────────────────────


def contact_node(node_id: int) -> str:
    """Connect once from the site's worker: a first contact records the offered host key for acceptance.

    The answer (ok, pending-key with the fingerprint, or error with the reason) is written on the node,
    where the node's page shows it.
    """
    node = Node.objects.select_related("credential", "jump_host__credential").filter(pk=node_id).first()
    if node is None:
        return "no such node"
    try:
        with ssh.connect(node):
            pass
    except ssh.HostKeyPending as pending:
        state, message = "pending-key", pending.fingerprint
    except ssh.SSHError as exc:
        state, message = "error", str(exc)
    else:
        state, message = "ok", ""
    Node.objects.filter(pk=node_id).update(contact_state=state, contact_message=message[:2000],
                                           contacted_at=timezone.now())
    return state

