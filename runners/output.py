"""Job output: chunks numbered per job with no gaps, so a live page can back-fill by number."""
from __future__ import annotations

from django.db import transaction
from django.db.models import F

from runners.models import Job, OutputChunk, Step


def append_output(job: Job | int, text: str, *, stream: str = OutputChunk.Stream.STDOUT, step: Step | None = None) -> OutputChunk | None:
    if not text:
        return None
    job_id = job if isinstance(job, int) else job.pk
    with transaction.atomic():
        # The row lock taken by this update serialises numbering across workers.
        Job.objects.filter(pk=job_id).update(chunk_count=F("chunk_count") + 1)
        seq = Job.objects.filter(pk=job_id).values_list("chunk_count", flat=True).get()
        return OutputChunk.objects.create(job_id=job_id, step=step, seq=seq, stream=stream, text=text)


def system_line(job: Job | int, text: str, *, step: Step | None = None) -> OutputChunk | None:
    return append_output(job, text.rstrip("\n") + "\n", stream=OutputChunk.Stream.SYSTEM, step=step)
