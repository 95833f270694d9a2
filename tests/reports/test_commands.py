"""signing_setup creates the embedded CA once and never overwrites; approver certificates; RSA only."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import KeyUsage
from django.core.management import call_command
from django.core.management.base import CommandError

from reports import sign
from reports.service import signing_directory


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("signing_setup", *args, stdout=out)
    return out.getvalue()


def test_signing_setup_creates_the_embedded_ca_once_and_never_overwrites(demo):
    folder = signing_directory()
    first = _run()
    files = {name: (folder / name).read_bytes() for name in ("root-key.pem", "root-cert.pem", "signer-key.pem", "signer-cert.pem")}
    second = _run()
    assert "nothing changed" in second or "created" not in second
    assert {name: (folder / name).read_bytes() for name in files} == files
    assert "created" in first or "already exist" in first
    cert = sign.load_cert(folder / "signer-cert.pem")
    usage = cert.extensions.get_extension_for_class(KeyUsage).value
    assert usage.digital_signature and usage.content_commitment
    assert cert.public_key().key_size == 3072
    assert oct((folder / "signer-key.pem").stat().st_mode & 0o777) == "0o600"


def test_no_approver_key_is_made_on_the_control_plane(demo):
    """Issue 49: a customer approver makes his own key (scripts/fxpilot-countersign); the vendor's never does."""
    _run()
    with pytest.raises(CommandError, match="no longer makes a customer approver's key"):
        _run("--approver", "bob")
    assert not (signing_directory() / "approvers").exists()


def test_a_half_present_ca_is_refused_rather_than_replaced(tmp_path):
    sign.setup_authority(tmp_path)
    (tmp_path / "root-key.pem").unlink()
    with pytest.raises(sign.SigningError, match="without the other"):
        sign.setup_authority(tmp_path)


def test_an_ecdsa_key_is_refused_because_it_breaks_pdf_a(tmp_path, ca):
    key = ec.generate_private_key(ec.SECP256R1())
    path = Path(tmp_path / "ec.pem")
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    with pytest.raises(sign.SigningError, match="must be RSA"):
        sign.load_signer(path, ca / "signer-cert.pem")


def test_a_certificate_of_another_key_is_refused(ca, other_ca):
    with pytest.raises(sign.SigningError, match="does not belong to the key"):
        sign.load_signer(ca / "signer-key.pem", other_ca / "signer-cert.pem")


def test_the_kept_key_signs_what_pyhankos_own_signer_signs_and_a_bad_chain_file_is_named(ca, tmp_path):
    """load_signer parses and checks the key once; its signatures are pyHanko's, byte for byte (PKCS#1 v1.5 is
    deterministic), and a PSS signature verifies under the certificate's key."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding
    from pyhanko.sign.signers import SimpleSigner

    kept = sign.load_signer(ca / "signer-key.pem", ca / "signer-cert.pem", [ca / "root-cert.pem"])
    theirs = SimpleSigner.load(str(ca / "signer-key.pem"), str(ca / "signer-cert.pem"),
                               ca_chain_files=(str(ca / "root-cert.pem"),))
    data = b"the bytes a CMS signature covers"
    assert kept.sign_raw(data, "sha256") == theirs.sign_raw(data, "sha256")
    assert kept.signing_cert.dump() == theirs.signing_cert.dump()
    assert {c.dump() for c in kept.cert_registry} == {c.dump() for c in theirs.cert_registry}
    pss = sign.KeptKeySigner(kept._private_key, signing_cert=kept.signing_cert, signing_key=kept.signing_key,
                             cert_registry=kept.cert_registry, prefer_pss=True)
    signature = pss.sign_raw(data, "sha256")
    assert pss.get_signature_mechanism_for_digest("sha256").signature_algo == "rsassa_pss"
    sign.load_cert(ca / "signer-cert.pem").public_key().verify(
        signature, data, padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.AUTO), hashes.SHA256())
    broken = tmp_path / "chain.pem"
    broken.write_text("not a certificate")
    with pytest.raises(sign.SigningError, match="chain.pem: cannot read this certificate of the chain"):
        sign.load_signer(ca / "signer-key.pem", ca / "signer-cert.pem", [broken])


def test_a_key_or_certificate_replaced_on_disk_is_read_and_checked_again(ca, other_ca, tmp_path):
    import shutil

    key, cert = tmp_path / "signer-key.pem", tmp_path / "signer-cert.pem"
    shutil.copy(ca / "signer-key.pem", key)
    shutil.copy(ca / "signer-cert.pem", cert)
    first = sign.load_signer(key, cert)
    assert sign.load_signer(key, cert)._private_key is first._private_key  # read and checked once
    shutil.copy(other_ca / "signer-cert.pem", cert)  # the certificate alone replaced: no longer the key's
    with pytest.raises(sign.SigningError, match="does not belong to the key"):
        sign.load_signer(key, cert)
    shutil.copy(other_ca / "signer-key.pem", key)
    second = sign.load_signer(key, cert)
    assert "Someone Else" in sign.signer_name(second) and "Someone Else" not in sign.signer_name(first)
    key.unlink()
    with pytest.raises(sign.SigningError, match="no such key file"):
        sign.load_signer(key, cert)


def test_every_command_takes_the_short_code_the_portal_shows(signed_pilot):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    from gates.codes import CodeNotFound, find_by_code
    from gates.models import Pilot
    from runners.management.commands.run_gate import find_pilot

    pilot = signed_pilot.pilot
    short = str(pilot.code)[:8]
    assert find_by_code(Pilot.objects.all(), short, "pilot") == pilot == find_pilot(short)
    assert find_by_code(Pilot.objects.all(), short.upper(), "pilot") == pilot
    with pytest.raises(CodeNotFound, match="first 4"):
        find_by_code(Pilot.objects.all(), "abc", "pilot")
    with pytest.raises(CommandError, match="no pilot matches 'ffff0000'"):
        call_command("make_report", "ffff0000", "G1", stdout=StringIO())
    with pytest.raises(CommandError, match="no evaluation"):
        call_command("make_report", short, "G1", stdout=StringIO())
