"""`python manage.py broker status|start|stop`: the embedded Redis broker of this data folder (infra.broker)."""
from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from infra import broker


class Command(BaseCommand):
    help = ("The embedded broker (a Redis server on a Unix socket under FXPILOT_DATA_DIR/redis, used when "
            "CELERY_BROKER_URL is not set): status, start it in the background, or stop it.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("action", choices=["status", "start", "stop"])

    def handle(self, *args, action: str, **options) -> None:
        data = settings.DATA_DIR
        sock = broker.embedded_socket(data)
        if not settings.FXPILOT_EMBEDDED_BROKER:
            if action != "status":
                raise CommandError("CELERY_BROKER_URL is set: the broker is not the embedded one; manage that server")
            self.stdout.write("CELERY_BROKER_URL is set: the embedded broker is not used")
            return
        if action == "status":
            self.stdout.write(f"embedded broker on {sock}: {'running' if broker.ping(sock) else 'not running'}")
        elif action == "start":
            started = broker.ensure_running(data)
            self.stdout.write(f"embedded broker on {sock}: {'started' if started else 'already running'}")
        else:
            stopped = broker.stop_background(data)
            self.stdout.write(f"embedded broker on {sock}: {'stopped' if stopped else 'was not running'}")
