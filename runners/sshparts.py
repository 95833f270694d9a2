"""SSH pieces the control plane (runners.ssh, runners.credentials) and the site agent (runners.agent) share.

Django-free, like runners.sealing: the agent runs on a jump host without the project's settings. Each caller
validates its input its own way first (a ValidationError on the control plane, an error kind in the agent) and
then uses these for what must be the same on both sides: how a remote path is quoted for the shell and named over
SFTP, and how a loaded private key becomes the paramiko key that signs in.
"""
from __future__ import annotations

import io
import shlex
from dataclasses import dataclass

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa


@dataclass(frozen=True)
class Timeouts:
    """Seconds an SSH connection may take to answer, by stage; the keep-alive interval."""
    connect: float = 10.0
    banner: float = 15.0
    auth: float = 15.0
    channel: float = 15.0
    keepalive: int = 15


DEFAULT_TIMEOUTS = Timeouts()


class UnsupportedKey(ValueError):
    """A private key of a type fxpilot does not use (DSA, …); its type's name is the message."""


def shell_quoted(path: str) -> str:
    """A remote path quoted for the shell; a leading ``~/`` stays the remote user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def sftp_named(path: str) -> str:
    """SFTP has no ``~``: paths relative to the login directory (the home) are used instead."""
    if path == "~":
        return "."
    return path[2:] if path.startswith("~/") else path


def paramiko_key(loaded) -> paramiko.PKey:
    """A private key loaded by cryptography (RSA, ECDSA or Ed25519) as paramiko's key. paramiko reads some formats
    only (not PKCS#8 Ed25519, encrypted or not): it gets the key, already opened, in the OpenSSH format, in memory.
    UnsupportedKey for another type; ValueError when paramiko cannot read it."""
    if isinstance(loaded, rsa.RSAPrivateKey):
        key_class = paramiko.RSAKey
    elif isinstance(loaded, ed25519.Ed25519PrivateKey):
        key_class = paramiko.Ed25519Key
    elif isinstance(loaded, ec.EllipticCurvePrivateKey):
        key_class = paramiko.ECDSAKey
    else:
        raise UnsupportedKey(type(loaded).__name__)
    opened = loaded.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                  serialization.NoEncryption()).decode()
    try:
        return key_class.from_private_key(io.StringIO(opened))
    except (paramiko.SSHException, UnicodeDecodeError) as exc:
        raise ValueError(f"paramiko cannot read the key ({exc})") from None
