"""The read side of a gate run: its progress (step n of N, requests, time left), its live log, waiting for it.

Reads only; nothing here changes a run.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from django.db.models import Max
from django.utils import timezone

from runners.models import FINISHED, Job, OutputChunk, Status

LOG_BATCH = 500
"""The most chunks one read of the live log returns."""


TIMED_STEPS = {"soak": lambda params: float(params.get("seconds") or 0),
               # the load runs before, during and after the cut: the cut's start, the cut, as long again
               "fault": lambda params: 3 * float(params.get("cut_seconds") or 0)}
"""Step names whose length is a planned time rather than a number of requests: wall seconds from their parameters."""


def planned_seconds(step) -> float | None:
    """The wall time a timed step (a soak, a fault window) is planned to run, else None: its request count keeps
    growing while it runs, so its progress is its time (elapsed of planned), not requests done of a total."""
    planned = TIMED_STEPS.get(step.name)
    seconds = planned(step.params or {}) if planned else 0.0
    return seconds if seconds > 0 else None


def job_progress(job: Job) -> dict[str, Any]:
    """Step n of N, requests done of total, an estimate of the time left, and where the live log stands.

    A running timed step (`planned_seconds`) counts by its time: `seconds_elapsed` of `seconds_planned` in
    `current`, and the run cannot end before it does (the estimate of the time left is at least what it
    has still to run)."""
    steps = list(job.steps.select_related("node").order_by("seq"))
    total = len(steps)
    finished = sum(1 for s in steps if s.status in FINISHED)
    running = [s for s in steps if s.status == Status.RUNNING]
    done_requests = sum(s.requests_done for s in steps)
    total_requests = sum(max(s.requests_total, s.requests_done) for s in steps)
    now = timezone.now()
    timing = {s.pk: _step_timing(s, now) for s in running}
    fraction = 0.0
    if total:
        partial = sum(_step_fraction(s, *timing[s.pk]) for s in running)
        fraction = min(1.0, (finished + partial) / total)
    elapsed = None
    eta = None
    if job.started:
        end = job.finished or now
        elapsed = max(0.0, (end - job.started).total_seconds())
        if not job.is_finished and fraction > 0:
            eta = elapsed * (1 - fraction) / fraction
            timed_left = [planned - spent for spent, planned in timing.values() if planned is not None]
            if timed_left:
                eta = max(eta, *timed_left, 0.0)

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
             "requests_done": s.requests_done, "requests_total": s.requests_total,
             "seconds_elapsed": timing[s.pk][0], "seconds_planned": timing[s.pk][1],
             # a soak's floor: past its length it sends on until this many error-free requests (runners.steps);
             # the error-free ones so far, as the client last said (None from a client that does not say)
             "requests_floor": (s.params or {}).get("min_requests") if timing[s.pk][1] else None,
             "requests_ok": (s.remote or {}).get("requests_ok")}
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


def _step_timing(step, now) -> tuple[float | None, float | None]:
    """(seconds the running step has run, seconds it is planned to run when it is a timed step)."""
    spent = max(0.0, (now - step.started).total_seconds()) if step.started else None
    planned = planned_seconds(step)
    if planned is not None and spent is not None:
        return round(spent, 1), round(planned, 1)
    return (None if spent is None else round(spent, 1)), None


def _step_fraction(step, spent: float | None, planned: float | None) -> float:
    """How far a running step is: a timed step by its time, another by its requests (0 when it has no count)."""
    if planned:
        return min(1.0, (spent or 0.0) / planned)
    if step.requests_total:
        return min(1.0, step.requests_done / step.requests_total)
    return 0.0


class Chunk(NamedTuple):
    """One numbered piece of a run's live log.

    `label` names the step a node's output came from ("node1 replay/fx"); steps run in parallel, so their
    lines interleave and each line says whose it is. It is empty for the run's own lines (system lines say
    where they are from in their words). `continues` is true when the chunk goes on with a line its step
    started in an earlier chunk (a node's output arrives in pieces that need not end at a line break).
    """

    seq: int
    stream: str
    text: str
    label: str = ""
    continues: bool = False

    def lines(self) -> list[tuple[str, str]]:
        """(label, text) of each piece of a line in this chunk; the label only where a line starts."""
        out = []
        for index, line in enumerate(self.text.splitlines(keepends=True)):
            starts = index > 0 or not self.continues
            out.append((self.label if starts else "", line))
        return out


def step_output_label(name: str, arm: str, node: str | None) -> str:
    """How a step's output lines are labelled in the live log: node, step and arm."""
    return " ".join(part for part in (node or "", f"{name}/{arm}" if arm else name) if part)


def log_since(job: Job, after_seq: int = 0, limit: int = LOG_BATCH) -> list[Chunk]:
    """Up to `limit` live-log chunks numbered after `after_seq`, stopping at the first missing number.

    The gap rule: chunks are numbered 1, 2, 3 … per job, so a reader that has `after_seq` asks for the
    next number; a number not yet visible (its transaction has not committed) ends the batch, and the
    next read starts there, so no reader ever skips a chunk. The page, its poll, the API and the
    run_gate command all read the log through this function. A node's output carries its step's label.
    """
    rows = list(job.chunks.filter(seq__gt=after_seq).order_by("seq").values_list(
        "seq", "stream", "text", "step_id", "step__name", "step__arm", "step__node__name")[:limit])
    open_line = _open_lines(job, after_seq, {row[3] for row in rows if row[3] is not None})
    chunks = []
    for expected, (seq, stream, text, step_id, name, arm, node) in enumerate(rows, start=after_seq + 1):
        if seq != expected:
            break
        if step_id is None or stream == OutputChunk.Stream.SYSTEM:
            chunks.append(Chunk(seq, stream, text))
            continue
        chunks.append(Chunk(seq, stream, text, step_output_label(name, arm, node), open_line.get(step_id, False)))
        if text:
            open_line[step_id] = not text.endswith("\n")
    return chunks


def _open_lines(job: Job, after_seq: int, steps: set[int]) -> dict[int, bool]:
    """Step → whether its output up to chunk `after_seq` ended inside a line (two queries, whatever the steps)."""
    if not after_seq or not steps:
        return {}
    output = OutputChunk.objects.filter(job=job, step_id__in=steps, seq__lte=after_seq).exclude(
        stream=OutputChunk.Stream.SYSTEM)
    last = output.values("step_id").annotate(last=Max("seq")).values_list("last", flat=True)
    return {step_id: not text.endswith("\n")
            for step_id, text in OutputChunk.objects.filter(job=job, seq__in=list(last)).values_list("step_id", "text")}


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
