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


# A scoped IPv6 address (fe80::1%eth0) names an interface or its index after the %: nothing else.
_SCOPE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}|[0-9]{1,10})$")


def validate_host(value: str) -> str:
    """An IPv4/IPv6 address (an IPv6 scope must be an interface name or index) or an RFC 1123 host name."""
    value = (value or "").strip()
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        address = None
    if address is not None:
        scope = getattr(address, "scope_id", None)
        if scope is not None and not _SCOPE.match(scope):
            raise ValidationError(
                _("“%(value)s”: the scope after %% must be an interface name (at most 15 letters, digits, _ . -, not "
                  "starting with -) or an interface number."), code="host", params={"value": value})
        return value
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


# vLLM options a deployment may not pass: they run code from the model repository or the node
# (--trust-remote-code, plugins, classes or processors to import), let the API read the node's files or
# fetch URLs (--allowed-local-media-path, --allowed-media-domains), load more options from a file
# (--config), open the API to other origins (CORS), or put a secret on the command line where `ps` and the
# run log show it. argparse also accepts an unambiguous prefix of an option, so prefixes are refused too.
FORBIDDEN_VLLM_FLAGS = (
    "--trust-remote-code", "--allowed-local-media-path", "--allowed-media-domains", "--config",
    "--middleware", "--tool-parser-plugin", "--reasoning-parser-plugin", "--logits-processors",
    "--worker-cls", "--worker-extension-cls", "--allowed-origins", "--allowed-methods", "--allowed-headers",
    "--allow-credentials", "--api-key", "--hf-token",
)


def validate_vllm_flag(flag: str) -> str:
    """A --flag (or --flag=value) for `vllm serve` that fxpilot lets a deployment add."""
    name = flag.split("=", 1)[0]
    for forbidden in FORBIDDEN_VLLM_FLAGS:
        if name == forbidden or (len(name) >= 4 and forbidden.startswith(name)):
            raise ValidationError(
                _("%(flag)s is not allowed: it is or abbreviates %(forbidden)s, which would let vLLM run code, read files "
                  "or expose what the pilot did not agree to."),
                code="vllm-flag", params={"flag": name, "forbidden": forbidden})
    return flag


# A customer trace arrives in a public format (docs/traces.md) and may hold a day of traffic (hundreds of
# thousands of requests, hundreds of MB): it is streamed to the evidence store from the upload's temporary file,
# never held whole (runners.traces.receive_file), and read by the worker from a file (benchmarks/traces: a 1 M-request
# analysis in under 1 GiB). The limit bounds the disk and the worker's time, not the web tier's memory.
# FXPILOT_TRACE_MAX_BYTES in the settings overrides it.
TRACE_MAX_BYTES = 1024 * 1024 * 1024


def trace_max_bytes() -> int:
    from django.conf import settings

    return int(getattr(settings, "FXPILOT_TRACE_MAX_BYTES", TRACE_MAX_BYTES))


def validate_trace_size(size: int) -> int:
    """Refuse a trace over the limit before it is read."""
    limit = trace_max_bytes()
    if size > limit:
        raise ValidationError(
            _("The trace is %(size)s bytes; the largest accepted is %(limit)s bytes (%(mb)s MB). Replay a sample of "
              "the sessions."), code="trace-size", params={"size": size, "limit": limit, "mb": limit // 2**20})
    return size


# Celery's own default queue name (what a worker started without -Q consumes) and the Redis transport's own keys
# (kombu keeps its unacknowledged messages under these names, beside the queues' lists).
_CONTROL_TIER_NAMES = ("celery", "unacked", "unacked_index", "unacked_mutex")


def control_tier_queues() -> frozenset[str]:
    """The queues of the control tier — the web tier's own worker: the control queue (CELERY_TASK_DEFAULT_QUEUE,
    `fxpilot`), the PDF checks' queue (FXPILOT_CHECK_QUEUE, `fxpilot-checks`), Celery's default queue name and the broker's own keys. A site's queue is none of them: a site's work
    (contacting a node, a step on it) must run on the worker that reaches that site, never on the web tier's worker,
    which would otherwise open connections to any host and port a vendor engineer registers.
    A new queue served by the control worker belongs here too."""
    from django.conf import settings

    return frozenset({settings.CELERY_TASK_DEFAULT_QUEUE, getattr(settings, "FXPILOT_CHECK_QUEUE", "fxpilot-checks"),
                      *_CONTROL_TIER_NAMES})


def validate_site_queue(value: str) -> str:
    """A site's Celery queue: not a queue of the control tier (compared without regard to case)."""
    reserved = {name.lower() for name in control_tier_queues()}
    if (value or "").strip().lower() in reserved:
        raise ValidationError(
            _("“%(value)s” is a queue of the portal's own worker (the control tier); a site's queue must be its own, "
              "served by the worker that reaches the site."), code="queue", params={"value": value})
    return value
