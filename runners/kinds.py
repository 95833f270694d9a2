"""The step-kind vocabulary: what a kind of step is, the context a handler gets, and the registry.

A kind runs in one task (`run`) or detached (`start`, then `poll` until the remote process ends,
then `finish`). Handlers say how a step ended by raising: StepFailed (the stack ran and missed a
bar), StepError (the infrastructure broke), TransientError (worth another try). The gate-run kinds
(runners.steps) are registered by RunnersConfig.ready(); tests register their own stand-ins.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from runners.models import Job, Node, Status, Step
from runners.output import append_output, system_line


class TransientError(Exception):
    """Worth another try after a pause (a dropped or refused connection)."""


class StepFailed(Exception):
    """The stack ran and missed a bar: the step (and the job) end `failed`, never `error`."""


class StepError(Exception):
    """The infrastructure broke; the message says what, in words a person can act on."""


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
    # A detached step's deadline, in seconds after its start: how long its remote work may last, so how long
    # an unreachable node is looked for again before the step is an error (None: FXPILOT_STEP_DEADLINE_SECONDS).
    max_seconds: Callable[[Step], float | None] | None = None

    @property
    def detached(self) -> bool:
        return self.start is not None


KINDS: dict[str, StepKind] = {}


def register_kind(kind: StepKind) -> StepKind:
    KINDS[kind.name] = kind
    return kind


def get_kind(name: str) -> StepKind:
    try:
        return KINDS[name]
    except KeyError:
        raise StepError(f"no step kind named {name!r} is known to this worker") from None


def known_kind(name: str) -> StepKind:
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
