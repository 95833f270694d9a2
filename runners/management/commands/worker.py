"""`python manage.py worker`: one Celery worker on the control queue, the PDF checks' queue and every site's queue
(embedded default)."""
from __future__ import annotations

import os
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from infra.broker import ensure_running
from runners.queues import CHECK_QUEUE, CONTROL_QUEUE, all_queues


class Command(BaseCommand):
    help = ("Start a Celery worker. By default it serves the control queue and the queue of every site known now "
            "(restart it after adding a site); --queues names them instead (a jump-host worker: --queues SITE). "
            "--beat also runs the reconcile schedule in the same process.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--queues", help=f"comma-separated queues (default: {CONTROL_QUEUE}, {CHECK_QUEUE} and every site's)")
        parser.add_argument("--concurrency", type=int, default=2, help="worker processes (default 2)")
        parser.add_argument("--beat", action="store_true", help="embed the beat scheduler (one per installation)")
        parser.add_argument("--hostname", help="worker node name (default fxpilot@<host>)")
        parser.add_argument("--loglevel", default="INFO")
        parser.add_argument("--include", help="comma-separated extra task modules to import (Celery's --include)")

    def handle(self, *args, queues: str | None, concurrency: int, beat: bool, hostname: str | None, loglevel: str,
               include: str | None, **options) -> None:
        names = [q.strip() for q in queues.split(",") if q.strip()] if queues else all_queues()
        if not names:
            raise CommandError("no queue to serve")
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        argv = [sys.executable, "-m", "celery", "-A", "fxpilot", "worker", "-Q", ",".join(names),
                "-c", str(concurrency), "-l", loglevel, "--without-gossip", "--without-mingle",
                "-n", hostname or "fxpilot@%h"]
        if beat:
            argv += ["-B", "-s", settings.CELERY_BEAT_SCHEDULE_FILENAME]
        if include:
            argv += ["--include", include]
        if settings.FXPILOT_EMBEDDED_BROKER:
            ensure_running(settings.DATA_DIR)
        self.stdout.write(f"worker on {', '.join(names)}{' with beat' if beat else ''}")
        self.stdout.flush()
        # This process becomes the Celery worker, so a signal sent to its pid reaches Celery. SIGTERM
        # means a cold shutdown after CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT: running tasks get that long,
        # then they are stopped and their messages go back to the queue (the reconcile sweep resumes
        # their steps), the embedded beat and the pool processes stop with it.
        env = {**os.environ, "REMAP_SIGTERM": "SIGQUIT"}
        if not {CONTROL_QUEUE, CHECK_QUEUE} & set(names):
            # A site worker (a jump host) does only node work. Celery's Django fix-up would run the system checks,
            # which import the portal's URLs and views and with them the PDF renderer and signer: a jump host
            # then needed Pango and fonts to start. The web tier and the control worker run the checks.
            env["CELERY_SKIP_CHECKS"] = "1"
        os.execve(sys.executable, argv, env)
