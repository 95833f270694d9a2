"""`python manage.py results export (PILOT|RUN) --format aiperf|llm-d|csv --out DIR` and
`python manage.py results attach PILOT FILE` (docs/results.md)."""
from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from gates.codes import CodeNotFound, find_by_code
from gates.management.lookup import REFUSED, command_line_actor, find_pilot
from gates.models import Pilot
from reports.exports import FORMATS, ExportError, export
from reports.exports.attach import AttachError, attach
from runners.artifacts import ArtifactMismatch, EvidenceStoreError
from runners.models import Job


def _pilot_or_run(text: str) -> Pilot | Job:
    try:
        return find_by_code(Pilot.objects.all(), text, "pilot", name_field="name")
    except CodeNotFound as as_pilot:
        try:
            return find_by_code(Job.objects.all(), text, "run")
        except CodeNotFound:
            raise CommandError(f"{as_pilot} (and no run has that code either)", returncode=REFUSED) from None


class Command(BaseCommand):
    help = "Export a run's or a pilot's results in AIPerf, llm-d or CSV form; attach a customer's own measurement."

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        out = sub.add_parser("export", help="write the results of a pilot (all its runs) or of one run")
        out.add_argument("target", help="pilot name or code, or a run code (a unique prefix of 4+ characters)")
        out.add_argument("--format", dest="fmt", choices=FORMATS, required=True)
        out.add_argument("--out", required=True, help="folder to write into (created when missing)")
        att = sub.add_parser("attach", help="attach a customer's vLLM bench serve JSON or AIPerf export to a pilot")
        att.add_argument("pilot", help="pilot name or code")
        att.add_argument("file", help="the customer's file")
        att.add_argument("--as", dest="actor", default=None, help="who attaches, for the manifest")

    def handle(self, *args, action: str, **options) -> None:
        if action == "export":
            self._export(options["target"], options["fmt"], Path(options["out"]))
        else:
            self._attach(options["pilot"], options["file"], options["actor"] or command_line_actor())

    def _export(self, target: str, fmt: str, out: Path) -> None:
        found = _pilot_or_run(target)
        try:
            written = export(found, fmt, out)
        except (ExportError, ArtifactMismatch) as error:
            raise CommandError(str(error)) from None
        if not written:
            raise CommandError(f"{found}: no run with stored records to export")
        for path in written:
            self.stdout.write(str(path))

    def _attach(self, pilot_text: str, path: str, actor: str) -> None:
        pilot = find_pilot(pilot_text)
        try:
            manifest = attach(pilot, path, actor=actor)
        except (AttachError, EvidenceStoreError) as error:
            raise CommandError(str(error)) from None
        self.stdout.write(f"attached {manifest['file']} ({manifest['format']}, sha256 {manifest['sha256']}) to "
                          f"{pilot.name} as the customer's own measurement, not fxpilot evidence")
