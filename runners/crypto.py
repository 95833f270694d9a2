"""Per-field encryption of secrets at rest (AWX style).

A field's key is derived from SECRET_KEY with HKDF-SHA256 and an info string naming the field, so
one leaked field key opens nothing else. Tokens are versioned and name the key they were made with:
``fxpilot$1$<key id>$<base64url(nonce ‖ AES-256-GCM ciphertext)>``; the field name is bound as
associated data, so a token copied into another field does not decrypt.
"""
from __future__ import annotations

import base64
import hashlib
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

PREFIX = "fxpilot"
VERSION = "1"
_SALT = b"fxpilot field encryption v1"


class DecryptionError(Exception):
    """A token that cannot be opened: wrong secret, wrong field, or altered."""


def _field_key(field: str, secret: str | None) -> bytes:
    secret = settings.SECRET_KEY if secret is None else secret
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=f"fxpilot:field:{field}".encode()).derive(
        secret.encode())


def key_id(field: str, secret: str | None = None) -> str:
    """A short public name of the key (a hash of it), so a token says which secret made it."""
    return hashlib.sha256(b"key-id" + _field_key(field, secret)).hexdigest()[:8]


def encrypt_field(plaintext: str, field: str, *, secret: str | None = None) -> str:
    if plaintext == "":
        return ""
    nonce = os.urandom(12)
    sealed = AESGCM(_field_key(field, secret)).encrypt(nonce, plaintext.encode(), field.encode())
    body = base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")
    return f"{PREFIX}${VERSION}${key_id(field, secret)}${body}"


def decrypt_field(token: str, field: str, *, secret: str | None = None) -> str:
    if token == "":
        return ""
    parts = token.split("$")
    if len(parts) != 4 or parts[0] != PREFIX:
        raise DecryptionError(f"{field}: not an fxpilot encrypted value")
    if parts[1] != VERSION:
        raise DecryptionError(f"{field}: encryption version {parts[1]} is not supported (this build knows {VERSION})")
    if parts[2] != key_id(field, secret):
        raise DecryptionError(f"{field}: encrypted under another secret key (key id {parts[2]}); "
                              "run `manage.py reencrypt_secrets` with the old key")
    raw = base64.urlsafe_b64decode(parts[3] + "=" * (-len(parts[3]) % 4))
    try:
        return AESGCM(_field_key(field, secret)).decrypt(raw[:12], raw[12:], field.encode()).decode()
    except InvalidTag:
        raise DecryptionError(f"{field}: the encrypted value was altered or belongs to another field") from None


def is_encrypted_with(token: str, field: str, *, secret: str | None = None) -> bool:
    return token == "" or token.split("$")[2:3] == [key_id(field, secret)]
