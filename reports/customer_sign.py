"""The customer approver's side of a countersignature: his own key, his own certificate, his own signing.

Needs only pyHanko and cryptography (reports.sign, no Django, no control-plane data). Run on the approver's machine:

    python -m reports.customer_sign init --dir ~/.fxpilot-countersign --name "Bob Wang" --organisation "Example Cloud"
    python -m reports.customer_sign sign REPORT.pdf --dir ~/.fxpilot-countersign -o REPORT-countersigned.pdf

(`scripts/fxpilot-countersign` is the same command.) `init` makes an RSA-3072 key pair and a document-signing
certificate issued by a root made for it alone; the root's private key is thrown away once the certificate is
issued, so that root vouches for this one certificate and nothing else. It writes `approver-key.pem` (mode 0600,
encrypted when a passphrase is given) and `approver-cert.pem` (the certificate, then its root): only the latter is
uploaded to the portal. `sign` adds one incremental PAdES revision to the exact bytes given and prints both
SHA-256 values, so the approver compares the first with the one the portal shows for the version he read.
"""
from __future__ import annotations

import argparse
import getpass
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from reports import sign

KEY_FILE = "approver-key.pem"
CERT_FILE = "approver-cert.pem"
PASSPHRASE_ENV = "FXPILOT_COUNTERSIGN_PASSPHRASE"


class CustomerSignError(Exception):
    """Unusable enrolment or signing material; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Certificate:
    """An approver's certificate as enrolled: the signing certificate, its root, and the leaf's fingerprint."""

    leaf: x509.Certificate
    root: x509.Certificate
    pem: bytes

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.leaf)

    @property
    def root_fingerprint(self) -> str:
        return fingerprint(self.root)

    @property
    def subject(self) -> str:
        return self.leaf.subject.rfc4514_string()


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 over the certificate's DER bytes, lower-case hex (what `openssl x509 -fingerprint -sha256` shows)."""
    return cert.fingerprint(hashes.SHA256()).hex()


def init(directory: Path, name: str, organisation: str, *, passphrase: str | None = None,
         days: int = 1095) -> tuple[Path, Path]:
    """Make the approver's key and certificate under `directory`; never overwrites. Returns (key, certificate)."""
    directory = Path(directory)
    key_path, cert_path = directory / KEY_FILE, directory / CERT_FILE
    for path in (key_path, cert_path):
        if path.exists():
            raise CustomerSignError(f"{path} exists already: nothing was changed (move it away to make a new key)")
    if not name.strip() or not organisation.strip():
        raise CustomerSignError("--name and --organisation must not be empty: they are written in the certificate")
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    root_key, root_cert = sign.make_root(f"{name} countersigning root", organisation, days=days)
    key, cert = sign.issue_signing_certificate(root_key, root_cert, name, organisation, days=days)
    del root_key  # the root issues this one certificate and nothing else: its key is never written
    sign._write_new(key_path, sign.key_pem(key, passphrase), 0o600)
    sign._write_new(cert_path, sign.cert_pem(cert) + sign.cert_pem(root_cert), 0o644)
    return key_path, cert_path


def parse_certificate(data: bytes, *, source: str = "the uploaded file") -> Certificate:
    """An approver's certificate file: PEM, the signing certificate then the root that issued it. Refused, named,
    when it holds a private key, is not PEM, or the certificate cannot sign documents or is not its root's."""
    if b"PRIVATE KEY" in data:
        raise CustomerSignError(f"{source} holds a private key: never upload the key, only {CERT_FILE}")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as error:
        raise CustomerSignError(f"{source} is not a PEM certificate file ({error})") from None
    if len(certs) not in (1, 2):
        raise CustomerSignError(f"{source} holds {len(certs)} certificates; expected the signing certificate and "
                                "its root (2), or one self-signed certificate")
    leaf, root = certs[0], certs[-1]
    if not isinstance(leaf.public_key(), rsa.RSAPublicKey):
        raise CustomerSignError(f"{source}: the signing certificate's key must be RSA (an ECDSA key turns the PDF "
                                "into PDF 2.0 and breaks PDF/A-3b)")
    try:
        usage = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
        can_sign = usage.digital_signature
    except x509.ExtensionNotFound:
        can_sign = True
    if not can_sign:
        raise CustomerSignError(f"{source}: the signing certificate does not allow digital signatures (key usage)")
    if root.subject != root.issuer:
        raise CustomerSignError(f"{source}: the last certificate is not a root (issuer {root.issuer.rfc4514_string()} "
                                f"is not its subject {root.subject.rfc4514_string()})")
    try:
        root.public_key().verify(leaf.signature, leaf.tbs_certificate_bytes, padding.PKCS1v15(),
                                 leaf.signature_hash_algorithm)
        if root is not leaf:
            root.public_key().verify(root.signature, root.tbs_certificate_bytes, padding.PKCS1v15(),
                                     root.signature_hash_algorithm)
    except Exception as error:  # noqa: BLE001 — any failure is the same verdict: not issued by this root
        raise CustomerSignError(f"{source}: the signing certificate was not issued by the root that follows it "
                                f"({type(error).__name__})") from None
    pem = b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in (certs if len(certs) == 2 else [leaf]))
    return Certificate(leaf=leaf, root=root, pem=pem)


def countersign_bytes(pdf: bytes, key_path: Path, cert_path: Path, *, passphrase: str | None = None,
                      reason: str = "", location: str = "", tsa_url: str | None = None) -> bytes:
    """One more incremental PAdES revision over exactly `pdf`, signed with the approver's own key."""
    cert_path, key_path = Path(cert_path), Path(key_path)
    try:
        enrolled = parse_certificate(cert_path.read_bytes(), source=str(cert_path))
    except OSError as error:
        raise CustomerSignError(f"{cert_path}: cannot read ({error.strerror})") from None
    try:
        signer = sign.load_signer(key_path, cert_path, [cert_path], passphrase)
    except sign.SigningError as error:
        raise CustomerSignError(str(error).replace("run `python manage.py signing_setup`", "run `init` first").replace(
            "check FXPILOT_SIGNING_KEY_PASSPHRASE", f"give the key's passphrase ({PASSPHRASE_ENV}, --passphrase-file "
            "or --ask-passphrase)")) from None
    name = enrolled.leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    who = name[0].value if name else enrolled.subject
    try:
        field_name = sign.next_approver_field(pdf)
    except Exception as error:  # noqa: BLE001 — pyHanko raises many kinds on a damaged file
        raise CustomerSignError(f"not a readable PDF ({type(error).__name__}: {error})") from None
    signed = sign.sign_pdf(pdf, signer, field_name=field_name, reason=reason or f"Approved by {who}",
                           location=location, tsa_url=tsa_url)
    if not signed.startswith(pdf):
        raise CustomerSignError("the signed file does not keep the bytes read; nothing was written")
    return signed


def _passphrase(args) -> str | None:
    if args.passphrase_file:
        return Path(args.passphrase_file).read_text().rstrip("\n") or None
    if os.environ.get(PASSPHRASE_ENV):
        return os.environ[PASSPHRASE_ENV]
    if getattr(args, "ask_passphrase", False):
        return getpass.getpass("passphrase for the approver key: ") or None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fxpilot-countersign", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    init_cmd = commands.add_parser("init", help="make your key pair and certificate (the key never leaves this machine)")
    init_cmd.add_argument("--dir", required=True, type=Path, help="folder for approver-key.pem and approver-cert.pem")
    init_cmd.add_argument("--name", required=True, help="your name, as the certificate states it")
    init_cmd.add_argument("--organisation", required=True, help="your organisation, as the certificate states it")
    sign_cmd = commands.add_parser("sign", help="countersign the exact report file you read")
    sign_cmd.add_argument("pdf", type=Path, help="the report version downloaded from the portal")
    sign_cmd.add_argument("--dir", type=Path, help="the folder `init` wrote (default for --key and --cert)")
    sign_cmd.add_argument("--key", type=Path)
    sign_cmd.add_argument("--cert", type=Path)
    sign_cmd.add_argument("-o", "--output", type=Path, help="where to write the countersigned file "
                          "(default: NAME-countersigned.pdf next to the input)")
    sign_cmd.add_argument("--expect-sha256", help="refuse unless the input has this SHA-256 (the portal shows it)")
    sign_cmd.add_argument("--reason", default="")
    sign_cmd.add_argument("--location", default="")
    sign_cmd.add_argument("--tsa-url", help="an RFC 3161 time-stamp authority")
    for command in (init_cmd, sign_cmd):
        command.add_argument("--passphrase-file", help=f"file holding the key's passphrase (or set {PASSPHRASE_ENV})")
        command.add_argument("--ask-passphrase", action="store_true", help="ask for the key's passphrase")
    args = parser.parse_args(argv)
    try:
        if args.command == "init":
            key, cert = init(args.dir, args.name, args.organisation, passphrase=_passphrase(args))
            enrolled = parse_certificate(cert.read_bytes(), source=str(cert))
            print(f"created {key} (your private key: keep it on this machine, never upload it)")
            print(f"created {cert} (upload this file to the portal to enrol)")
            print(f"certificate SHA-256 fingerprint: {enrolled.fingerprint}")
            return 0
        if not (args.dir or (args.key and args.cert)):
            parser.error("sign needs --dir, or --key and --cert")
        key, cert = args.key or args.dir / KEY_FILE, args.cert or args.dir / CERT_FILE
        try:
            data = args.pdf.read_bytes()
        except OSError as error:
            raise CustomerSignError(f"{args.pdf}: cannot read ({error.strerror})") from None
        digest = hashlib.sha256(data).hexdigest()
        if args.expect_sha256 and args.expect_sha256.strip().lower() != digest:
            raise CustomerSignError(f"{args.pdf} has SHA-256 {digest}, not {args.expect_sha256}: it is not the version "
                                    "you meant to countersign; nothing was signed")
        signed = countersign_bytes(data, key, cert, passphrase=_passphrase(args), reason=args.reason,
                                   location=args.location, tsa_url=args.tsa_url)
        output = args.output or args.pdf.with_name(args.pdf.stem + "-countersigned.pdf")
        sign._write_new(output, signed, 0o644)
        print(f"read    {args.pdf}: SHA-256 {digest} (compare with the portal's)")
        print(f"wrote   {output}: SHA-256 {hashlib.sha256(signed).hexdigest()} (upload this file to the portal)")
        return 0
    except (CustomerSignError, sign.SigningError, FileExistsError) as error:
        print(f"fxpilot-countersign: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
