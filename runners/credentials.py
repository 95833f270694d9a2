"""Credentials: an uploaded SSH private key, checked, fingerprinted and stored encrypted.

The key is never logged, printed or returned to a browser; only the SSH layer decrypts it, in memory. A site with an
enrolled agent (runners.agents) has its keys sealed to that agent instead: the control plane cannot open them.
"""
from __future__ import annotations

import paramiko
from cryptography.hazmat.primitives import serialization
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext_lazy as _

from runners import sshparts
from runners.crypto import DecryptionError, decrypt_field, encrypt_field
from runners.models import Credential, Site, SiteAgent, active_agent
from runners.sealing import seal

PRIVATE_KEY_FIELD = "runners.Credential.private_key"
PASSPHRASE_FIELD = "runners.Credential.passphrase"
MAX_KEY_BYTES = 64 * 1024


def _load(data: bytes, passphrase: str | None):
    password = passphrase.encode() if passphrase else None
    try:
        return serialization.load_ssh_private_key(data, password=password)
    except ValueError as exc:
        if b"OPENSSH PRIVATE KEY" in data:
            raise _bad_passphrase_or_corrupt(exc, passphrase) from None
    try:
        return serialization.load_pem_private_key(data, password=password)
    except ValueError as exc:
        raise _bad_passphrase_or_corrupt(exc, passphrase) from None


def _bad_passphrase_or_corrupt(exc: Exception, passphrase: str | None) -> ValidationError:
    text = str(exc).lower()
    if passphrase and ("decrypt" in text or "password" in text or "checksum" in text):
        return ValidationError(_("The passphrase does not open this private key."), code="passphrase")
    return ValidationError(_("This file is not a private key in OpenSSH or PEM format."), code="not_a_key")


def load_private_key(text: str | bytes, passphrase: str = "") -> paramiko.PKey:
    """Parse an RSA, ECDSA or Ed25519 private key (OpenSSH or PEM) into a paramiko key, or explain why not."""
    data = text.encode() if isinstance(text, str) else bytes(text)
    if len(data) > MAX_KEY_BYTES:
        raise ValidationError(_("This file is too large to be an SSH private key."), code="too_large")
    if b"PRIVATE KEY" not in data:
        hint = _(" It looks like a public key; upload the private half.") if data.lstrip().startswith((b"ssh-", b"ecdsa-")) else ""
        raise ValidationError(_("This file is not a private key in OpenSSH or PEM format.") + hint, code="not_a_key")
    if b"BEGIN DSA PRIVATE KEY" in data:
        raise ValidationError(_("DSA keys are not supported; use Ed25519, ECDSA or RSA."), code="key_type")
    try:
        loaded = _load(data, passphrase or None)
    except TypeError:
        # cryptography's signal that a passphrase is missing, or was given for a key that has none
        if passphrase:
            raise ValidationError(_("This private key is not encrypted; leave the passphrase empty."),
                                  code="passphrase_not_needed") from None
        raise ValidationError(_("This private key is encrypted; enter its passphrase."), code="passphrase_required") from None
    try:
        return sshparts.paramiko_key(loaded)
    except sshparts.UnsupportedKey as exc:
        raise ValidationError(_("Unsupported key type %(type)s; use Ed25519, ECDSA or RSA."), code="key_type",
                              params={"type": str(exc)}) from None
    except ValueError:
        raise ValidationError(_("This file is not a private key in OpenSSH or PEM format."), code="not_a_key") from None


class SealedCredential(DecryptionError):
    """The credential is sealed to the site agent: the control plane cannot open it."""


def create_credential(site: Site, name: str, private_key: str | bytes, passphrase: str = "", *, created_by=None) -> Credential:
    """Validate the key, then store it: sealed to the site's agent when it has one (only that agent can open it
    again), else encrypted with the control plane's key. Nothing is saved if the key is refused."""
    pkey = load_private_key(private_key, passphrase)
    text = private_key.decode() if isinstance(private_key, bytes) else private_key
    fields = {"public_fingerprint": pkey.fingerprint, "key_type": pkey.get_name()}
    with transaction.atomic():
        agent = active_agent(site)
        if agent is not None:
            fields.update(private_key_encrypted="", passphrase_encrypted="", sealed_to=agent,
                          sealed_key=seal(agent.public_key, text.encode()),
                          sealed_passphrase=seal(agent.public_key, (passphrase or "").encode()))
        else:
            fields.update(private_key_encrypted=encrypt_field(text, PRIVATE_KEY_FIELD),
                          passphrase_encrypted=encrypt_field(passphrase or "", PASSPHRASE_FIELD))
        return Credential.objects.create(site=site, name=name, created_by=created_by, **fields)


def credential_pkey(credential: Credential) -> paramiko.PKey:
    """The decrypted key, in memory only, for the SSH layer; a credential sealed to the site agent is refused."""
    if credential.sealed_key:
        agent = credential.sealed_to
        key = f" (agent key {agent.key_fingerprint})" if agent is not None and agent.public_key else ""
        raise SealedCredential(f"credential {credential.name} is sealed to the site agent of {credential.site.name}"
                               f"{key}: only that agent can open it; the control plane cannot")
    return load_private_key(decrypt_field(credential.private_key_encrypted, PRIVATE_KEY_FIELD),
                            decrypt_field(credential.passphrase_encrypted, PASSPHRASE_FIELD))


def reseal_for_agent(agent: SiteAgent) -> int:
    """Seal to `agent`'s public key every credential of its site it cannot open yet: those still encrypted with
    the control plane's key (decrypted here, sealed, and their encrypted fields cleared) and those sealed to a
    previous agent of the site that had the same key (an agent re-enrolled with its state kept). One
    transaction; returns how many credentials changed. Credentials sealed to another key are left alone: only
    that key's agent could open them, so they must be uploaded again."""
    if not agent.public_key:
        raise ValueError("the agent has not registered its public key yet")
    changed = 0
    with transaction.atomic():
        for credential in Credential.objects.select_for_update(of=("self",)).select_related("sealed_to").filter(
                site=agent.site_id).order_by("pk"):
            if credential.sealed_key:
                if credential.sealed_to_id != agent.pk and credential.sealed_to is not None and \
                        credential.sealed_to.public_key == agent.public_key:
                    Credential.objects.filter(pk=credential.pk).update(sealed_to=agent)
                    changed += 1
                continue
            try:
                text = decrypt_field(credential.private_key_encrypted, PRIVATE_KEY_FIELD)
                passphrase = decrypt_field(credential.passphrase_encrypted, PASSPHRASE_FIELD)
            except DecryptionError as exc:
                raise DecryptionError(f"credential {credential.name} ({credential.code}) cannot be resealed: "
                                      f"{exc}") from None
            Credential.objects.filter(pk=credential.pk).update(
                sealed_key=seal(agent.public_key, text.encode()), sealed_passphrase=seal(agent.public_key,
                                                                                          passphrase.encode()),
                sealed_to=agent, private_key_encrypted="", passphrase_encrypted="")
            changed += 1
    return changed
