"""Re-encrypt every stored secret under the current SECRET_KEY, after the deployment secret changed.

    OLD_SECRET_KEY=... manage.py reencrypt_secrets        (or --old-secret-file PATH)

All or nothing: one transaction; a value that opens with neither key stops the command and names it. Credentials
sealed to a site agent (runners.sealing) do not depend on SECRET_KEY and are left as they are.
"""
from __future__ import annotations

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from runners.credentials import PASSPHRASE_FIELD, PRIVATE_KEY_FIELD
from runners.crypto import DecryptionError, decrypt_field, encrypt_field, is_encrypted_with
from runners.models import Credential

FIELDS = (("private_key_encrypted", PRIVATE_KEY_FIELD), ("passphrase_encrypted", PASSPHRASE_FIELD))


class Command(BaseCommand):
    help = "Re-encrypt stored credentials under the current SECRET_KEY (old key from OLD_SECRET_KEY or --old-secret-file)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--old-secret-file", default=None, help="file holding the previous SECRET_KEY")

    def handle(self, *args, **opts) -> None:
        if opts["old_secret_file"]:
            old = Path(opts["old_secret_file"]).read_text().strip()
        else:
            old = os.environ.get("OLD_SECRET_KEY", "")
        if not old:
            raise CommandError("give the previous secret in OLD_SECRET_KEY or --old-secret-file (never on the command line)")
        changed = kept = sealed = 0
        with transaction.atomic():
            for credential in Credential.objects.select_for_update().order_by("pk"):
                if credential.sealed_key:
                    sealed += 1  # sealed to the site agent's key: SECRET_KEY never opened it
                    continue
                updates = {}
                for attr, field in FIELDS:
                    token = getattr(credential, attr)
                    if is_encrypted_with(token, field):
                        continue
                    try:
                        updates[attr] = encrypt_field(decrypt_field(token, field, secret=old), field)
                    except DecryptionError as exc:
                        raise CommandError(f"credential {credential.name} ({credential.code}): {exc}; nothing was changed") from None
                if updates:
                    Credential.objects.filter(pk=credential.pk).update(**updates)
                    changed += 1
                else:
                    kept += 1
        note = f"; {sealed} sealed to a site agent (not under SECRET_KEY)" if sealed else ""
        self.stdout.write(self.style.SUCCESS(f"re-encrypted {changed} credential(s); {kept} already under the current "
                                             f"key{note}"))
