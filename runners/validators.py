"""Validators for every value that may reach a remote shell: hosts, ports, user names, paths.

They raise django's ValidationError, so forms use them as field validators and the SSH layer
calls them before building a command line. Quoting (shlex.quote) is still done at each use.
"""
from __future__ import annotations

import ipaddress
import re

from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_USERNAME = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$", re.IGNORECASE)
_NQN = re.compile(r"^nqn\.\d{4}-\d{2}\.[A-Za-z0-9.-]+(:[\x21-\x7e]+)?$")


def validate_host(value: str) -> str:
    """An IPv4/IPv6 address or an RFC 1123 host name."""
    value = (value or "").strip()
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not value or len(value) > 253:
        raise ValidationError(_("“%(value)s” is neither an IP address nor a host name."), code="host", params={"value": value})
    labels = value.rstrip(".").split(".")
    if not all(_LABEL.match(label) for label in labels) or labels[-1].isdigit():
        raise ValidationError(_("“%(value)s” is neither an IP address nor a host name."), code="host", params={"value": value})
    return value


def validate_port(value: int | str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise ValidationError(_("Port “%(value)s” is not a number."), code="port", params={"value": value}) from None
    if not 1 <= port <= 65535:
        raise ValidationError(_("Port %(value)s is out of range (1–65535)."), code="port", params={"value": port})
    return port


def validate_username(value: str) -> str:
    if not _USERNAME.match(value or ""):
        raise ValidationError(
            _("“%(value)s” is not a valid user name (letters, digits, _ . -; at most 32; not starting with a digit or -)."),
            code="username", params={"value": value})
    return value


def validate_remote_path(value: str) -> str:
    """A path on a node: non-empty, no NUL or line break (they would split a command line)."""
    if not value or any(ch in value for ch in "\x00\n\r"):
        raise ValidationError(_("The remote path %(value)r is empty or holds a NUL or line break."), code="path",
                              params={"value": value})
    if len(value) > 4096:
        raise ValidationError(_("The remote path is longer than 4096 characters."), code="path")
    return value


def validate_nqn(value: str) -> str:
    """An NVMe Qualified Name (nqn.yyyy-mm.reverse.domain[:anything printable])."""
    if not value or len(value) > 223 or not _NQN.match(value):
        raise ValidationError(_("“%(value)s” is not an NVMe qualified name (nqn.yyyy-mm.domain:…)."), code="nqn",
                              params={"value": value})
    return value
