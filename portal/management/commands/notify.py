"""Send the notifications that are due (people who must act, runs that ended); idempotent, so a loop may call it."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand

from portal.notifications import sweep


class Command(BaseCommand):
    help = "Notify who must act now (sign, sign off, accept a host key) and who is concerned by a run that ended."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--loop", action="store_true", help="keep running, sweeping every --interval seconds")
        parser.add_argument("--interval", type=float, default=30.0)

    def handle(self, *args, loop: bool = False, interval: float = 30.0, **options) -> None:
        while True:
            created = sweep()
            self.stdout.write(f"{created} notification(s) sent")
            if not loop:
                return
            time.sleep(max(1.0, interval))
