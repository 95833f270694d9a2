"""The read side of a gate run: its progress (step n of N, requests, time left), its live log, waiting for it.

Reads only; nothing here changes a run.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from django.utils import timezone

from runners.models import FINISHED, Job, Status

LOG_BATCH = 500
"""The most chunks one read of the live log returns."""


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


class Chunk(NamedTuple):
    """One numbered piece of a run's live log."""

    seq: int
    stream: str
    text: str


def log_since(job: Job, after_seq: int = 0, limit: int = LOG_BATCH) -> list[Chunk]:
    """Up to `limit` live-log chunks numbered after `after_seq`, stopping at the first missing number.

    The gap rule: chunks are numbered 1, 2, 3 … per job, so a reader that has `after_seq` asks for the
    next number; a number not yet visible (its transaction has not committed) ends the batch, and the
    next read starts there, so no reader ever skips a chunk. The page, its poll, the API and the
    run_gate command all read the log through this function.
    """
    rows = job.chunks.filter(seq__gt=after_seq).order_by("seq").values_list("seq", "stream", "text")[:limit]
    chunks = []
    for expected, row in enumerate(rows, start=after_seq + 1):
        if row[0] != expected:
            break
        chunks.append(Chunk(*row))
    return chunks


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
