"""`python manage.py cancel_run JOB`: stop a run: no new steps, remote processes killed, teardown, canceled."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from gates.codes import CodeNotFound, find_by_code
from runners.models import Job
from runners.orchestration import request_cancel, wait_for


class Command(BaseCommand):
    help = "Cancel a run by its code (or a unique prefix of it); --wait until it has ended."

    def add_arguments(self, parser) -> None:
        parser.add_argument("job", help="run code or a unique prefix")
        parser.add_argument("--wait", type=float, default=0, help="seconds to wait for the run to end")
        parser.add_argument("--as", dest="actor", default="cancel_run", help="who cancels, for the audit log")

    def handle(self, *args, job: str, wait: float, actor: str, **options) -> None:
        try:
            the_job = find_by_code(Job.objects.all(), job, "run")
        except CodeNotFound as error:
            raise CommandError(str(error)) from None
        if the_job.is_finished:
            self.stdout.write(f"run {the_job.code} has already ended ({the_job.status})")
            return
        request_cancel(the_job, actor)
        self.stdout.write(f"cancel requested for run {the_job.code}")
        if wait:
            the_job = wait_for(the_job, wait)
            self.stdout.write(f"run {the_job.status}")
