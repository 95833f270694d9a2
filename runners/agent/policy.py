"""The customer's limits on where a site agent may connect (issue 49, item 2): kept on the jump host, never sent by
the control plane, checked before any connect.

Always refused, whatever the allow-list says: link-local addresses (169.254.0.0/16 — the cloud metadata service
169.254.169.254 among them — and fe80::/10), multicast, the unspecified address and the broadcast address. A node
spec naming one is refused as `invalid` with the rule, and nothing is sent.

`FXPILOT_AGENT_ALLOW` (optional) narrows the rest: a comma-separated list of entries `NETWORK[:PORT]` — an address
or a CIDR network, IPv6 in brackets when it has a port (`10.20.0.0/16:22`, `[fd00::/8]:22`, `192.0.2.7`). With it,
the agent connects only to an address inside one of the networks, on that entry's port when it names one. Without
it, any other address is allowed (the embedded default's simulated nodes are on loopback); production sites should
set it. A host name is resolved on the jump host and every address it resolves to must be allowed; the connection
then goes to the address that was checked (a second lookup could answer otherwise). A node behind a jump host is
checked when it is given as an address; a name there resolves on the jump host, which the policy checks in turn.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

ALLOW = "FXPILOT_AGENT_ALLOW"
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_NEVER = (
    (ipaddress.ip_network("169.254.0.0/16"), "a link-local address (the cloud metadata service lives there)"),
    (ipaddress.ip_network("fe80::/10"), "a link-local address"),
    (ipaddress.ip_network("224.0.0.0/4"), "a multicast address"),
    (ipaddress.ip_network("ff00::/8"), "a multicast address"),
    (ipaddress.ip_network("0.0.0.0/32"), "the unspecified address"),
    (ipaddress.ip_network("::/128"), "the unspecified address"),
    (ipaddress.ip_network("255.255.255.255/32"), "the broadcast address"),
)


class PolicyError(ValueError):
    """The allow-list cannot be read; the message names the entry."""


class Refused(Exception):
    """An address the policy refuses; the message names the address and the rule."""


@dataclass(frozen=True)
class Entry:
    network: Network
    port: int | None = None

    def admits(self, address: Address, port: int) -> bool:
        return address in self.network and (self.port is None or self.port == port)

    def __str__(self) -> str:
        text = str(self.network)
        if self.port is None:
            return text
        return f"[{text}]:{self.port}" if self.network.version == 6 else f"{text}:{self.port}"


def _entry(text: str) -> Entry:
    raw, port = text, None
    if raw.startswith("["):
        inside, _, rest = raw[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise PolicyError(f"{ALLOW}: {text!r} is not NETWORK[:PORT]")
        raw, port_text = inside, rest[1:] if rest else ""
    elif raw.count(":") == 1:
        raw, port_text = raw.split(":")
    else:
        port_text = ""
    if port_text:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise PolicyError(f"{ALLOW}: {text!r}: the port must be a number from 1 to 65535")
        port = int(port_text)
    try:
        network = ipaddress.ip_network(raw, strict=False)
    except ValueError:
        raise PolicyError(f"{ALLOW}: {text!r} is not an address or a CIDR network (host names are not accepted: "
                          "they could resolve elsewhere later)") from None
    return Entry(network, port)


@dataclass(frozen=True)
class AddressPolicy:
    allow: tuple[Entry, ...] | None = None   # None: everything but the addresses always refused

    @classmethod
    def parse(cls, text: str | None) -> AddressPolicy:
        entries = [part.strip() for part in (text or "").split(",") if part.strip()]
        return cls(tuple(_entry(part) for part in entries) if entries else None)

    def describe(self) -> str:
        if self.allow is None:
            return "any address but link-local, multicast, unspecified and broadcast ones"
        return "only " + ", ".join(str(entry) for entry in self.allow)

    def check(self, address: Address, port: int, *, what: str) -> None:
        """Refused unless the policy admits (address, port); `what` names the node for the message."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        for network, why in _NEVER:
            if address.version == network.version and address in network:
                raise Refused(f"{what}: {address} is {why}; the site agent never connects there")
        if self.allow is not None and not any(entry.admits(address, port) for entry in self.allow):
            raise Refused(f"{what}: {address} port {port} is outside what the customer allows this agent "
                          f"({ALLOW}: {self.describe()})")

    def check_literal(self, host: str, port: int, *, what: str) -> None:
        """Check `host` when it is an address; a name is left to whoever resolves it."""
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return
        self.check(address, port, what=what)

    def resolve(self, host: str, port: int, *, what: str) -> list[tuple]:
        """getaddrinfo's stream addresses of (host, port), every one of them checked; socket.gaierror as it comes."""
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        for *_, sockaddr in found:
            self.check(ipaddress.ip_address(sockaddr[0].split("%")[0]), port, what=what)
        return found


def connect(found: list[tuple], timeout: float) -> socket.socket:
    """A TCP connection to the first of the checked addresses that answers; the last error when none does."""
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in found:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error or OSError("no address to connect to")
