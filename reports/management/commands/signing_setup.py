"""Create the embedded default's signing material (root CA, vendor signer). Never a customer approver's key:
he makes his own with `fxpilot-countersign init` on his own machine (docs/reports.md)."""
from __future__ import annotations

import argparse
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gates.models import Organisation
from reports import sign
from reports.service import signing_directory


class Command(BaseCommand):
    help = ("Create a root certificate and an RSA-3072 signing certificate under DATA_DIR/signing (never overwrites). "
            "Customer approvers make their own key and certificate with scripts/fxpilot-countersign.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--approver", metavar="USERNAME", help=argparse.SUPPRESS)
        parser.add_argument("--organisation", help="organisation named in the vendor certificates (default: the vendor)")

    def handle(self, *args, **options) -> None:
        folder = signing_directory()
        passphrase = settings.FXPILOT_SIGNING_KEY_PASSPHRASE or None
        try:
            if options["approver"]:
                raise CommandError(
                    f"--approver {options['approver']}: the control plane no longer makes a customer approver's key "
                    "(the vendor could then sign as the customer). The approver runs `scripts/fxpilot-countersign "
                    "init` on his own machine and enrols approver-cert.pem in the portal (docs/reports.md).")
            vendor = Organisation.objects.filter(kind=Organisation.Kind.VENDOR).order_by("id").first()
            organisation = options["organisation"] or (vendor.name if vendor else "fxpilot")
            created = sign.setup_authority(folder, organisation=organisation, passphrase=passphrase)
        except sign.SigningError as error:
            raise CommandError(str(error)) from None
        for path in created:
            self.stdout.write(f"created {path}")
        if not created:
            self.stdout.write(f"{folder}: root and signing certificate already exist; nothing changed")
        configured = Path(settings.FXPILOT_SIGNING_CERT)
        if configured.parent != folder:
            self.stdout.write(self.style.WARNING(
                f"FXPILOT_SIGNING_CERT points to {configured}: reports are signed with that, not with these files"))
        self.stdout.write(f"trust root for verification: {settings.FXPILOT_SIGNING_ROOT}")
