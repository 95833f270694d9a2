"""Verify a signed report: signatures, whole-file coverage, trust, attachments. Exit 0 only when all holds."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from reports.verify import describe, verify_pdf


class Command(BaseCommand):
    help = "Verify a signed fxpilot report PDF. Exit status 0: verified; 1: not verified (reasons printed)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", help="the PDF to check")
        parser.add_argument("--root", action="append", metavar="PEM",
                            help="trusted root certificate (repeatable; default: FXPILOT_SIGNING_ROOT)")
        parser.add_argument("--json", action="store_true", help="print the full result as JSON")

    def handle(self, *args, **options) -> None:
        path = Path(options["file"])
        roots = [Path(p) for p in options["root"] or [settings.FXPILOT_SIGNING_ROOT]]
        for root in roots:
            if not root.is_file():
                raise CommandError(f"{root}: no such root certificate (pass --root or set FXPILOT_SIGNING_ROOT)")
        try:
            data = path.read_bytes()
        except OSError as error:
            raise CommandError(f"{path}: cannot read: {error.strerror}") from None
        result = verify_pdf(data, roots)
        if options["json"]:
            self.stdout.write(json.dumps(result.to_dict(), indent=1, ensure_ascii=False))
        else:
            self.stdout.write(f"{path}:")
            self.stdout.write(describe(result))
        if not result.ok:
            sys.exit(1)
