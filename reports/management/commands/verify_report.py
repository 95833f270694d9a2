"""Verify a signed report: signatures, whole-file coverage, trust, attachments. Exit 0 only when all holds."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from reports import customer_sign_store
from reports.verify import describe, load_trust_roots, verify_pdf


def _describe_certs(pem: bytes) -> str:
    """The certificate (and root) a file holds, by name and SHA-256 fingerprint."""
    try:
        certs = load_trust_roots([pem])
    except ValueError as error:
        return f"unreadable ({error})"
    return "; ".join(f"{cert.subject.human_friendly} (SHA-256 {cert.sha256.hex()})" for cert in certs)


class Command(BaseCommand):
    help = "Verify a signed fxpilot report PDF. Exit status 0: verified; 1: not verified (reasons printed)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", help="the PDF to check")
        parser.add_argument("--root", action="append", metavar="PEM",
                            help="trusted root certificate (repeatable; default: FXPILOT_SIGNING_ROOT)")
        parser.add_argument("--customer-cert", action="append", metavar="PEM",
                            help="a customer approver's certificate file as he made it (approver-cert.pem; repeatable; "
                                 "default: every certificate enrolled in this portal)")
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
        if options["customer_cert"]:
            customers = []
            for name in options["customer_cert"]:
                try:
                    customers.append(Path(name).read_bytes())
                except OSError as error:
                    raise CommandError(f"{name}: cannot read the customer certificate: {error.strerror}") from None
        else:
            customers = customer_sign_store.enrolled_certificates()
        result = verify_pdf(data, roots, customer_certs=customers)
        if options["json"]:
            self.stdout.write(json.dumps(result.to_dict(), indent=1, ensure_ascii=False))
        else:
            self.stdout.write(f"{path}:")
            for root in roots:
                self.stdout.write(f"Vendor root (供应商根证书): {_describe_certs(root.read_bytes())}")
            for pem in customers:
                self.stdout.write(f"Customer certificate (客户证书): {_describe_certs(pem)}")
            self.stdout.write(describe(result))
        if not result.ok:
            sys.exit(1)
