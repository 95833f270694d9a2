"""Credentials: only real private keys are stored, encrypted per field, never readable back in clear."""
from __future__ import annotations

import io
import subprocess

import paramiko
import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from runners import crypto
from runners.credentials import PRIVATE_KEY_FIELD, create_credential, credential_pkey, load_private_key
from runners.models import Credential


def _keygen(tmp_path, kind: str, fmt: str = "", passphrase: str = "") -> str:
    path = tmp_path / f"key-{kind}-{fmt or 'openssh'}-{bool(passphrase)}"
    args = ["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-f", str(path), "-C", "test"]
    if kind == "rsa":
        args += ["-b", "2048"]
    if fmt:
        args += ["-m", fmt]
    subprocess.run(args, check=True)
    return path.read_text()


@pytest.mark.parametrize("kind, fmt, name", [("ed25519", "", "ssh-ed25519"), ("ecdsa", "", "ecdsa-sha2-nistp256"),
                                             ("rsa", "", "ssh-rsa"), ("rsa", "PEM", "ssh-rsa"),
                                             ("ecdsa", "PEM", "ecdsa-sha2-nistp256")])
def test_it_accepts_ed25519_ecdsa_and_rsa_keys_in_openssh_and_pem_format(tmp_path, site, kind, fmt, name):
    text = _keygen(tmp_path, kind, fmt)
    credential = create_credential(site, f"{kind} {fmt}", text)
    assert credential.key_type == name and credential.public_fingerprint.startswith("SHA256:")
    assert text not in credential.private_key_encrypted and "PRIVATE KEY" not in credential.private_key_encrypted
    assert credential_pkey(credential).fingerprint == credential.public_fingerprint


def test_the_fingerprint_matches_what_ssh_keygen_prints(tmp_path, site):
    text = _keygen(tmp_path, "ed25519")
    printed = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "key-ed25519-openssh-False")], capture_output=True,
                             text=True, check=True).stdout.split()[1]
    assert create_credential(site, "k", text).public_fingerprint == printed


def test_an_encrypted_key_needs_its_passphrase_and_nothing_is_saved_without_it(tmp_path, site):
    text = _keygen(tmp_path, "ed25519", passphrase="correct horse")
    with pytest.raises(ValidationError, match="encrypted; enter its passphrase"):
        create_credential(site, "locked", text)
    with pytest.raises(ValidationError, match="passphrase does not open"):
        create_credential(site, "locked", text, "wrong")
    assert not Credential.objects.exists()
    credential = create_credential(site, "locked", text, "correct horse")
    assert "correct horse" not in credential.passphrase_encrypted
    assert credential_pkey(credential).get_name() == "ssh-ed25519"


def test_an_encrypted_pem_key_without_its_passphrase_is_refused(tmp_path):
    text = _keygen(tmp_path, "rsa", "PEM", passphrase="secret")
    with pytest.raises(ValidationError, match="encrypted; enter its passphrase"):
        load_private_key(text)


@pytest.mark.parametrize("content, message", [
    ("hello world", "not a private key"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n", "not a private key"),
    ("-----BEGIN DSA PRIVATE KEY-----\nAAAA\n-----END DSA PRIVATE KEY-----\n", "DSA keys are not supported"),
])
def test_a_file_that_is_not_a_usable_private_key_is_refused(site, content, message):
    with pytest.raises(ValidationError, match=message):
        create_credential(site, "bad", content)
    assert not Credential.objects.exists()


def test_a_public_key_gets_a_hint_to_upload_the_private_half(tmp_path, site):
    _keygen(tmp_path, "ed25519")
    public = (tmp_path / "key-ed25519-openssh-False.pub").read_text()
    with pytest.raises(ValidationError, match="upload the private half"):
        create_credential(site, "pub", public)


def test_a_field_token_opens_only_for_its_field_and_its_secret(settings):
    token = crypto.encrypt_field("s3cret", "runners.Credential.private_key")
    assert token.startswith("fxpilot$1$") and "s3cret" not in token
    assert crypto.decrypt_field(token, "runners.Credential.private_key") == "s3cret"
    with pytest.raises(crypto.DecryptionError, match="another secret key"):
        crypto.decrypt_field(token, "runners.Credential.passphrase")
    tampered = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    with pytest.raises(crypto.DecryptionError, match="altered"):
        crypto.decrypt_field(tampered, "runners.Credential.private_key")
    with pytest.raises(crypto.DecryptionError, match="another secret key"):
        crypto.decrypt_field(token, "runners.Credential.private_key", secret="another secret " * 4)


def test_reencrypt_secrets_moves_every_credential_to_the_new_secret(site, settings, monkeypatch):
    buf = io.StringIO()
    paramiko.RSAKey.generate(2048).write_private_key(buf)
    credential = create_credential(site, "rotating", buf.getvalue(), "")
    old = settings.SECRET_KEY
    settings.SECRET_KEY = "a brand new deployment secret, long enough " * 2
    with pytest.raises(crypto.DecryptionError):
        crypto.decrypt_field(credential.private_key_encrypted, PRIVATE_KEY_FIELD)
    with pytest.raises(CommandError, match="OLD_SECRET_KEY"):
        call_command("reencrypt_secrets", stdout=io.StringIO())
    monkeypatch.setenv("OLD_SECRET_KEY", old)
    out = io.StringIO()
    call_command("reencrypt_secrets", stdout=out)
    assert "re-encrypted 1 credential" in out.getvalue()
    credential.refresh_from_db()
    assert credential_pkey(credential).fingerprint == credential.public_fingerprint
    call_command("reencrypt_secrets", stdout=out)
    assert "0 credential(s); 1 already under the current key" in out.getvalue()


def test_reencrypt_secrets_with_a_wrong_old_secret_changes_nothing(site, settings, monkeypatch, tmp_path):
    buf = io.StringIO()
    paramiko.RSAKey.generate(2048).write_private_key(buf)
    credential = create_credential(site, "rotating", buf.getvalue())
    before = credential.private_key_encrypted
    settings.SECRET_KEY = "a brand new deployment secret, long enough " * 2
    wrong = tmp_path / "old"
    wrong.write_text("not the old secret at all, but long enough")
    with pytest.raises(CommandError, match="rotating .*nothing was changed"):
        call_command("reencrypt_secrets", old_secret_file=str(wrong), stdout=io.StringIO())
    credential.refresh_from_db()
    assert credential.private_key_encrypted == before
