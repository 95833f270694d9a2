"""Secrets sealed to one site agent: libsodium's sealed box (X25519 + XSalsa20-Poly1305, via PyNaCl).

The site agent makes its key pair on the customer's jump host and sends the control plane only the public half;
whatever is sealed to it (a site's SSH private keys) can be opened by that agent alone — not by the web tier, the
control workers or another site's agent. This is the shape GitHub Actions uses for repository secrets.

Django-free: the agent (runners.agent) imports it without settings. A sealed value is
``sealed$1$<base64url(ciphertext)>``; the version lets a later scheme sit beside this one.
"""
from __future__ import annotations

import base64
import hashlib

from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox

PREFIX = "sealed"
VERSION = "1"


class SealError(Exception):
    """A sealed value that cannot be opened here (another agent's key, altered, or not a sealed value)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_keypair() -> tuple[str, str]:
    """(private, public), each base64url of 32 bytes."""
    key = PrivateKey.generate()
    return _b64(bytes(key)), _b64(bytes(key.public_key))


def public_of(private_b64: str) -> str:
    return _b64(bytes(_private(private_b64).public_key))


def _private(private_b64: str) -> PrivateKey:
    try:
        return PrivateKey(_unb64(private_b64.strip()))
    except (ValueError, TypeError) as exc:
        raise SealError(f"not an agent private key ({exc})") from None


def check_public(public_b64: str) -> str:
    """The public key, normalised, or SealError when it is not 32 bytes of base64url."""
    try:
        raw = _unb64(public_b64.strip())
    except (ValueError, TypeError):
        raise SealError("the public key is not base64url") from None
    if len(raw) != 32:
        raise SealError(f"the public key has {len(raw)} bytes; an X25519 key has 32")
    return _b64(raw)


def seal(public_b64: str, data: bytes) -> str:
    if not data:
        return ""
    box = SealedBox(PublicKey(_unb64(check_public(public_b64))))
    return f"{PREFIX}${VERSION}${_b64(box.encrypt(data))}"


def open_sealed(private_b64: str, token: str) -> bytes:
    if not token:
        return b""
    parts = token.split("$")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise SealError("not a sealed value")
    if parts[1] != VERSION:
        raise SealError(f"sealing version {parts[1]} is not supported (this build knows {VERSION})")
    try:
        return SealedBox(_private(private_b64)).decrypt(_unb64(parts[2]))
    except (CryptoError, ValueError) as exc:
        raise SealError(f"sealed to another key or altered ({type(exc).__name__})") from None


def fingerprint(public_b64: str) -> str:
    """A short public name of an agent key, for pages and logs (like an SSH key's SHA256 fingerprint)."""
    digest = hashlib.sha256(_unb64(check_public(public_b64))).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")[:16]
