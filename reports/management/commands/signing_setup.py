"""Create the embedded default's signing material (root CA, vendor signer) and approver certificates."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from gates.models import Membership, Organisation, Role
from reports import sign
from reports.service import signing_directory


class Command(BaseCommand):
    help = ("Create a root certificate and an RSA-3072 signing certificate under DATA_DIR/signing (never overwrites), "
            "or with --approver USERNAME a countersigning certificate for a customer approver.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--approver", metavar="USERNAME", help="issue a certificate for this customer approver")
        parser.add_argument("--organisation", help="organisation named in the vendor certificates (default: the vendor)")

    def handle(self, *args, **options) -> None:
        folder = signing_directory()
        passphrase = settings.FXPILOT_SIGNING_KEY_PASSPHRASE or None
        try:
            if options["approver"]:
                self._approver(folder, options["approver"], passphrase)
                return
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

    def _approver(self, folder: Path, username: str, passphrase: str | None) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"--approver {username}: no such user")
        membership = (Membership.objects.filter(user=user, role=Role.CUSTOMER_APPROVER).select_related("organisation")
                      .first())
        if membership is None:
            raise CommandError(f"--approver {username}: {username} is not a customer approver in any organisation")
        key, cert, created = sign.setup_approver(folder, username, user.get_full_name() or username,
                                                 membership.organisation.name, passphrase=passphrase)
        self.stdout.write(f"{'created' if created else 'already exists'}: {cert} (key {key})")
