"""PAdES signatures with pyHanko, and the embedded default's small certificate authority.

RSA only: an ECDSA key makes pyHanko declare PDF 2.0 (ISO/TS 32002), which breaks PDF/A-3b.
The vendor's signature certifies the document allowing only further signatures (DocMDP level 2), so
the customer approver's countersignature is a second incremental revision and nothing else can be.
"""
from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from asn1crypto import keys as asn1_keys
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID
from pyhanko.keys import load_certs_from_pemder
from pyhanko.pdf_utils import generic
from pyhanko.pdf_utils.incremental_writer import IncrementalPdfFileWriter
from pyhanko.pdf_utils.metadata.model import VENDOR
from pyhanko.pdf_utils.reader import PdfFileReader
from pyhanko.sign import fields, signers, timestamps
from pyhanko.sign.timestamps import TimestampRequestError
from pyhanko_certvalidator.registry import SimpleCertificateStore
from pyhanko_certvalidator.util import get_pyca_cryptography_hash, process_pss_params

RSA_BITS = 3072
VENDOR_FIELD = "VendorSignature"
APPROVER_FIELD_PREFIX = "CustomerApproval"


class SigningError(Exception):
    """The signing material is missing or unusable; the message says which file and what to do."""


@dataclass(frozen=True)
class SigningPaths:
    key: Path
    cert: Path
    root: Path
    passphrase: str | None = None
    tsa_url: str | None = None


# --- the embedded default's certificate authority -------------------------------------------------

def _name(common_name: str, organisation: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation),
    ])


def new_rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)


def make_root(common_name: str, organisation: str, *, days: int = 3650) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    key = new_rsa_key()
    now = dt.datetime.now(dt.UTC)
    name = _name(common_name, organisation)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue_signing_certificate(root_key: rsa.RSAPrivateKey, root_cert: x509.Certificate, common_name: str,
                              organisation: str, *, days: int = 1095) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    """A document-signing certificate: digital signature + non-repudiation, as validators require."""
    key = new_rsa_key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(_name(common_name, organisation)).issuer_name(root_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=True, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()), critical=False)
        .sign(root_key, hashes.SHA256())
    )
    return key, cert


def key_pem(key: rsa.RSAPrivateKey, passphrase: str | None = None) -> bytes:
    encryption = (serialization.BestAvailableEncryption(passphrase.encode()) if passphrase
                  else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create a file that must not exist yet: signing material is never overwritten."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _load_key(path: Path, passphrase: str | None) -> rsa.RSAPrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), passphrase.encode() if passphrase else None)
    except FileNotFoundError:
        raise SigningError(f"{path}: no such key file; run `python manage.py signing_setup`") from None
    except (TypeError, ValueError) as error:
        raise SigningError(f"{path}: cannot read the private key ({error}); check FXPILOT_SIGNING_KEY_PASSPHRASE") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise SigningError(f"{path}: the signing key must be RSA (an ECDSA key turns the PDF into 2.0 and breaks PDF/A-3b)")
    return key


def load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(Path(path).read_bytes())
    except FileNotFoundError:
        raise SigningError(f"{path}: no such certificate file; run `python manage.py signing_setup`") from None
    except ValueError as error:
        raise SigningError(f"{path}: not a PEM certificate ({error})") from None


def setup_authority(directory: Path, *, organisation: str = "fxpilot", passphrase: str | None = None) -> list[str]:
    """Create root-key/cert and signer-key/cert under `directory` where missing; returns what was created."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    root_key_path, root_cert_path = directory / "root-key.pem", directory / "root-cert.pem"
    created: list[str] = []
    if root_cert_path.exists() != root_key_path.exists():
        raise SigningError(f"{directory}: one of root-key.pem / root-cert.pem exists without the other; "
                           "restore the missing file or move both away")
    if not root_cert_path.exists():
        root_key, root_cert = make_root(f"{organisation} evidence root", organisation)
        _write_new(root_key_path, key_pem(root_key, passphrase), 0o600)
        _write_new(root_cert_path, cert_pem(root_cert), 0o644)
        created += [str(root_key_path), str(root_cert_path)]
    root_key, root_cert = _load_key(root_key_path, passphrase), load_cert(root_cert_path)
    signer_key_path, signer_cert_path = directory / "signer-key.pem", directory / "signer-cert.pem"
    if signer_cert_path.exists() != signer_key_path.exists():
        raise SigningError(f"{directory}: one of signer-key.pem / signer-cert.pem exists without the other")
    if not signer_cert_path.exists():
        key, cert = issue_signing_certificate(root_key, root_cert, f"{organisation} evidence signer", organisation)
        _write_new(signer_key_path, key_pem(key, passphrase), 0o600)
        _write_new(signer_cert_path, cert_pem(cert), 0o644)
        created += [str(signer_key_path), str(signer_cert_path)]
    return created


_SAFE_USERNAME = re.compile(r"[A-Za-z0-9_.@+-]{1,150}")


def approver_paths(directory: Path, username: str) -> tuple[Path, Path]:
    if not _SAFE_USERNAME.fullmatch(username) or username.startswith("."):
        raise SigningError(f"{username!r}: a user name for a certificate file may use letters, digits and _.@+- only")
    folder = directory / "approvers"
    return folder / f"{username}-key.pem", folder / f"{username}-cert.pem"


def setup_approver(directory: Path, username: str, display_name: str, organisation: str, *,
                   passphrase: str | None = None) -> tuple[Path, Path, bool]:
    """A certificate for `username` issued by the VENDOR's embedded root; returns (key, cert, created). Never
    overwrites. No production path calls this (issue 49): a customer approver makes his own key and certificate with
    reports.customer_sign, and a signature with a certificate of this root in a customer-approval field is refused
    and fails verification as the vendor's. Kept for tests that make such a forgery or a two-signature file."""
    key_path, cert_path = approver_paths(directory, username)
    if cert_path.exists() and key_path.exists():
        return key_path, cert_path, False
    if cert_path.exists() or key_path.exists():
        raise SigningError(f"{key_path.parent}: only one of {key_path.name} / {cert_path.name} exists")
    root_key_path = directory / "root-key.pem"
    if not root_key_path.exists():
        raise SigningError(f"{root_key_path}: the root key is not here, so fxpilot cannot issue approver certificates; "
                           "issue one with your own CA and place it at " + str(cert_path))
    root_key, root_cert = _load_key(root_key_path, passphrase), load_cert(directory / "root-cert.pem")
    key, cert = issue_signing_certificate(root_key, root_cert, display_name or username, organisation)
    _write_new(key_path, key_pem(key), 0o600)
    _write_new(cert_path, cert_pem(cert), 0o644)
    return key_path, cert_path, True


# --- signing ---------------------------------------------------------------------------------------

class KeptKeySigner(signers.SimpleSigner):
    """pyHanko's SimpleSigner parses its private key from DER again for every signature, and the parse checks the
    RSA key (about 0.15 s of CPU per signature for a 3072-bit key, more on a busy machine). This one signs with the
    key load_signer parsed and checked once; what it signs is byte for byte what SimpleSigner would sign."""

    def __init__(self, private_key: rsa.RSAPrivateKey, **kwargs):
        super().__init__(**kwargs)
        self._private_key = private_key

    def sign_raw(self, data: bytes, digest_algorithm: str) -> bytes:
        mechanism = self.get_signature_mechanism_for_digest(digest_algorithm)
        name = mechanism.signature_algo
        if name == "rsassa_pkcs1v15":
            return self._private_key.sign(data, padding.PKCS1v15(), get_pyca_cryptography_hash(digest_algorithm))
        if name == "rsassa_pss":
            pss, hash_algorithm = process_pss_params(mechanism["parameters"])
            return self._private_key.sign(data, pss, hash_algorithm)
        return super().sign_raw(data, digest_algorithm)


# What load_signer read and checked, by the files' identities (path, inode, modification time, size) and the
# passphrase: a report worker signs every report with the same key, and checking a 3072-bit RSA key costs ~0.15 s of
# CPU. A key or certificate replaced on disk has another identity and is read and checked again.
_LOADED: dict[tuple, tuple] = {}
_LOADED_MAX = 32


def _identity(path: Path) -> tuple:
    stat = os.stat(path)
    return str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size


def _read_signing_material(key_path: Path, cert_path: Path, chain: list[Path], passphrase: str | None) -> tuple:
    key = _load_key(Path(key_path), passphrase)
    cert = load_cert(Path(cert_path))
    if cert.public_key().public_numbers() != key.public_key().public_numbers():
        raise SigningError(f"{cert_path}: this certificate does not belong to the key {key_path}")
    others = []
    for path in chain:
        try:
            others += list(load_certs_from_pemder([str(path)]))
        except (OSError, ValueError) as error:
            raise SigningError(f"{path}: cannot read this certificate of the chain ({error})") from None
    der_key = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key, asn1_x509.Certificate.load(cert.public_bytes(serialization.Encoding.DER)), \
        asn1_keys.PrivateKeyInfo.load(der_key), tuple(others)


def load_signer(key_path: Path, cert_path: Path, chain: list[Path] = (), passphrase: str | None = None) -> KeptKeySigner:
    try:
        identity = (tuple(_identity(Path(path)) for path in (key_path, cert_path, *chain)), passphrase)
    except OSError:
        identity = None  # a file is missing: reading it says which
    material = _LOADED.get(identity) if identity else None
    if material is None:
        material = _read_signing_material(key_path, cert_path, list(chain), passphrase)
        if identity:
            if len(_LOADED) >= _LOADED_MAX:
                _LOADED.clear()
            _LOADED[identity] = material
    key, cert, der_key, others = material
    registry = SimpleCertificateStore()
    registry.register_multiple(list(others))
    # a new signer each time (pyHanko's signers are not documented as shareable between threads); the key is shared
    return KeptKeySigner(key, signing_cert=cert, signing_key=der_key, cert_registry=registry)


def signer_name(signer: signers.SimpleSigner) -> str:
    return signer.signing_cert.subject.human_friendly


def sign_pdf(pdf: bytes, signer: signers.SimpleSigner, *, field_name: str, reason: str, location: str = "",
             certify: bool = False, tsa_url: str | None = None) -> bytes:
    """Append one PAdES signature as an incremental update; the input bytes are kept as they are."""
    writer = IncrementalPdfFileWriter(BytesIO(pdf), strict=False)
    _align_producer(writer)
    if certify:
        _dedupe_associated_files(writer)
    meta = signers.PdfSignatureMetadata(
        field_name=field_name, md_algorithm="sha256", subfilter=fields.SigSeedSubFilter.PADES,
        reason=reason, location=location or None, certify=certify,
        docmdp_permissions=fields.MDPPerm.FILL_FORMS,
    )
    timestamper = timestamps.HTTPTimeStamper(tsa_url, timeout=20) if tsa_url else None
    try:
        out = signers.PdfSigner(meta, signer=signer, timestamper=timestamper).sign_pdf(writer)
    except TimestampRequestError as error:
        raise SigningError(f"the time-stamp authority {tsa_url} did not answer usably ({error}); "
                           "fix FXPILOT_TSA_URL or unset it to sign without a time-stamp") from None
    return out.getvalue()


def _align_producer(writer: IncrementalPdfFileWriter) -> None:
    """PDF/A wants Info and XMP to agree; pyHanko writes its own name to XMP but appends it in Info."""
    info_ref = writer.trailer.raw_get("/Info") if "/Info" in writer.trailer else None
    if isinstance(info_ref, generic.IndirectObject):
        info = info_ref.get_object()
        if str(info.get("/Producer", "")) != VENDOR:
            info["/Producer"] = generic.TextStringObject(VENDOR)
            writer.mark_update(info_ref)


def _dedupe_associated_files(writer: IncrementalPdfFileWriter) -> None:
    """WeasyPrint 70 lists each attachment twice in the catalog's /AF; list each once (first revision only)."""
    associated = writer.root.get("/AF")
    if associated is None:
        return
    refs = [associated.raw_get(i) for i in range(len(associated))]
    unique = list(dict.fromkeys(refs))
    if len(unique) != len(refs):
        writer.root["/AF"] = generic.ArrayObject(unique)
        writer.update_root()


def next_approver_field(pdf: bytes) -> str:
    """A fresh field name for one more countersignature."""
    reader = PdfFileReader(BytesIO(pdf), strict=False)
    taken = {sig.field_name for sig in reader.embedded_signatures}
    number = 1
    while f"{APPROVER_FIELD_PREFIX}{number}" in taken:
        number += 1
    return f"{APPROVER_FIELD_PREFIX}{number}"
