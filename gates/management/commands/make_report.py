"""Make a signed report from the command line: a gate report, or the procurement report."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from gates.models import Gate, Pilot
from gates.plan import parse_gate_label
from gates.reports import service
from gates.reports.sign import SigningError


class Command(BaseCommand):
    help = "Render, sign and store a report. PILOT is the pilot's code or exact name; GATE is G1–G4 or 'procurement'."

    def add_arguments(self, parser) -> None:
        parser.add_argument("pilot")
        parser.add_argument("gate", help="G1, G2, G3, G4 or procurement")
        parser.add_argument("--language", default="en", help="en or zh-hans")

    def handle(self, *args, **options) -> None:
        pilot = Pilot.objects.filter(name=options["pilot"]).first()
        if pilot is None:
            try:
                pilot = Pilot.objects.filter(code=options["pilot"]).first()
            except Exception:  # noqa: BLE001 — not a UUID, so not a code either
                pilot = None
        if pilot is None:
            raise CommandError(f"{options['pilot']!r}: no pilot with that code or name")
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
