"""`manage.py export_bundle PILOT [--output DIR]`: write the pilot's reproduction bundle (.tar.gz)."""
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from gates.management.lookup import find_pilot
from reports.bundle import build_bundle


class Command(BaseCommand):
    help = "Write the reproduction bundle of a pilot: client, scripts, judge, plan, raw artifacts, verdicts, reports."

    def add_arguments(self, parser) -> None:
        parser.add_argument("pilot", help="the pilot's name or code (or its first characters)")
        parser.add_argument("--output", default=None, help="folder to write to (default: DATA_DIR/bundles)")

    def handle(self, *args, pilot: str, output: str | None, **options) -> None:
        obj = find_pilot(pilot)
        folder = Path(output) if output else Path(settings.DATA_DIR) / "bundles"
        folder.mkdir(parents=True, exist_ok=True)
        name, data = build_bundle(obj)
        path = folder / name
        path.write_bytes(data)
        self.stdout.write(str(path))
