"""`python manage.py reconcile [--loop]`: resume steps whose worker died (the beat entry does the same)."""
from __future__ import annotations

import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from runners.engine import reconcile


class Command(BaseCommand):
    help = ("Find steps whose heartbeat is stale (their worker died) and resume them: a detached step is polled "
            "again, any other step runs again; lost dispatches are re-sent. --loop repeats it.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--loop", action="store_true", help="repeat until interrupted")
        parser.add_argument("--interval", type=float, default=None,
                            help="seconds between sweeps (default FXPILOT_RECONCILE_SECONDS)")
        parser.add_argument("--stale", type=float, default=None,
                            help="a heartbeat older than this many seconds is stale (default FXPILOT_STALE_SECONDS)")

    def handle(self, *args, loop: bool, interval: float | None, stale: float | None, **options) -> None:
        interval = interval if interval is not None else settings.FXPILOT_RECONCILE_SECONDS
        try:
            while True:
                try:
                    close_old_connections()  # a long loop outlives database restarts
                    counts = reconcile(stale)
                except Exception as exc:  # noqa: BLE001 — one bad sweep must not end the loop
                    if not loop:
                        raise
                    self.stderr.write(f"reconcile: the sweep broke ({type(exc).__name__}: {exc}); trying again")
                    time.sleep(interval)
                    continue
                if counts["repolled"] or counts["requeued"] or counts["gave_up"] or counts["traces"] or not loop:
                    self.stdout.write(f"reconcile: {counts['repolled']} re-polled, {counts['requeued']} re-queued, "
                                      f"{counts['gave_up']} given up, {counts['jobs']} unfinished runs looked at, "
                                      f"{counts['traces']} trace analyses queued again")
                    self.stdout.flush()
                if not loop:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            return
