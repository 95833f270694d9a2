"""Make a signed report from the command line: a gate report, or the procurement report."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from gates.codes import CodeNotFound, find_by_code
from gates.models import Gate, Pilot
from gates.plan import parse_gate_label
from reports import service
from reports.sign import SigningError


class Command(BaseCommand):
    help = ("Render, sign and store a report. PILOT is the pilot's code, its short code (first 8 characters) or exact "
            "name; GATE is G1–G4 or 'procurement'.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("pilot")
        parser.add_argument("gate", help="G1, G2, G3, G4 or procurement")
        parser.add_argument("--language", default="en", help="en or zh-hans")

    def handle(self, *args, **options) -> None:
        try:
            pilot = find_by_code(Pilot.objects.all(), options["pilot"], "pilot", name_field="name")
        except CodeNotFound as error:
            raise CommandError(str(error)) from None
        try:
            if options["gate"].lower() == "procurement":
                report = service.create_procurement_report(pilot, language=options["language"], who="make_report")
            else:
                gate = pilot.gate(parse_gate_label(options["gate"]))
                report = service.create_gate_report(gate, language=options["language"], who="make_report")
        except Gate.DoesNotExist:
            raise CommandError(f"{pilot.name} has no gate {options['gate']}") from None
        except (KeyError, ValueError, service.ReportError, SigningError) as error:
            raise CommandError(str(error).strip("'\"")) from None
        self.stdout.write(f"{service.report_path(report)} sha256 {report.sha256} ({report.size} bytes)")
