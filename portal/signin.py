"""Login throttling on django-axes, keyed on the client's address and the name tried together, and our page.

Two limits, both counted over the last FXPILOT_LOGIN_LOCKOUT_MINUTES:

* **a name at an address** (FXPILOT_LOGIN_FAILURES_PER_NAME, 5): failures for one user name from one client
  address lock that name *at that address*. Many failures for alice lock alice there, the right password
  included; a stranger elsewhere who types "alice" locks only himself.
* **an address** (FXPILOT_LOGIN_FAILURES_PER_ADDRESS, 100): failures for any names from one client address lock
  that address (password spraying), except for a name that has signed in successfully from that address within
  FXPILOT_LOGIN_KNOWN_DAYS (30): a stranger spraying made-up names behind the same NAT does not lock out a
  person who signs in from there; that person's own name is still held by the first limit.
* **an account, from anywhere** (FXPILOT_LOGIN_FAILURES_PER_ACCOUNT, 10): past that many failures for one name
  from all addresses together, every further attempt for the name must come a growing delay after the last failure
  (1 s, doubling with each failure, at most FXPILOT_LOGIN_ACCOUNT_MAX_DELAY, 900 s); an attempt inside it is refused
  unchecked, the right password included (`account_wait`). Spraying one account from many addresses then gets one
  guess per delay, and the person gets in once the delay has passed: a stranger cannot lock them out for longer.

The client's address is the one the reverse proxy reports, believed only from a proxy listed in
FXPILOT_TRUSTED_PROXIES (`client_address`); otherwise it is the connection's own (REMOTE_ADDR).

Attempts are rows in the database (axes' AccessAttempt), so every web process counts the same
failures and a restart forgets none; a successful login clears nothing (AXES_RESET_ON_SUCCESS is off),
so an attacker cannot reset the count with an account of their own. Once locked, the right password
is refused too, until the cool-off has passed.
"""
from __future__ import annotations

import ipaddress
from datetime import timedelta
from functools import lru_cache

from axes.handlers.database import AxesDatabaseHandler
from axes.models import AccessAttempt, AccessLog
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import Max, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.translation import gettext as _

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def _networks(proxies: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(proxy, strict=False) for proxy in proxies)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """One hop of X-Forwarded-For as an address: '203.0.113.7', '2001:db8::1', '[2001:db8::1]:443', '1.2.3.4:80'."""
    text = text.strip().strip('"')
    if text.startswith("[") and "]" in text:
        text = text[1:text.index("]")]
    elif text.count(":") == 1:  # IPv4 with a port
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    return address.ipv4_mapped or address if isinstance(address, ipaddress.IPv6Address) else address


def client_address(request: HttpRequest) -> str:
    """The client's address: X-Forwarded-For is believed only when the connection comes from a trusted proxy
    (FXPILOT_TRUSTED_PROXIES: addresses or networks), and then only its right-most hop that is not itself a
    trusted proxy (whatever the client wrote to the left of it is ignored). Without a trusted proxy, the
    connection's own address (REMOTE_ADDR)."""
    peer = _address(request.META.get("REMOTE_ADDR", "")) or ipaddress.ip_address("0.0.0.0")
    trusted = _networks(tuple(getattr(settings, "FXPILOT_TRUSTED_PROXIES", ())))

    def is_trusted(address) -> bool:
        return any(address.version == network.version and address in network for network in trusted)

    if not trusted or not is_trusted(peer):
        return str(peer)
    hops = [hop for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    nearest = peer
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:  # not an address: what lies left of a trusted proxy is the client's own writing
            return str(nearest)
        if not is_trusted(address):
            return str(address)
        nearest = address
    return str(nearest)  # every hop a trusted proxy: the left-most of them


def attempted_username(request: HttpRequest, credentials: dict | None) -> str:
    """The name tried, as the count knows it: trimmed and lower-cased, so 'Alice ' and 'alice' add up."""
    name = (credentials or {}).get("username")
    if name is None:
        name = request.POST.get("username", "") if request is not None else ""
    return str(name).strip().lower()[:150]


def _known_here(name: str, address: str) -> bool:
    """Has this name signed in successfully from this address lately (axes' AccessLog of successful logins)?"""
    if not name or not address:
        return False
    since = timezone.now() - timedelta(days=settings.FXPILOT_LOGIN_KNOWN_DAYS)
    return AccessLog.objects.filter(username__iexact=name, ip_address=address, attempt_time__gte=since).exists()


def account_wait(name: str) -> float:
    """Seconds an attempt for `name` must still wait under the per-account limit (0: none)."""
    if not name:
        return 0.0
    now = timezone.now()
    since = now - timedelta(minutes=settings.FXPILOT_LOGIN_LOCKOUT_MINUTES)
    found = AccessAttempt.objects.filter(username=name, attempt_time__gte=since).aggregate(
        failures=Sum("failures_since_start"), last=Max("attempt_time"))
    beyond = (found["failures"] or 0) - settings.FXPILOT_LOGIN_FAILURES_PER_ACCOUNT
    if beyond < 0 or found["last"] is None:
        return 0.0
    delay = min(2.0 ** min(beyond, 30), float(settings.FXPILOT_LOGIN_ACCOUNT_MAX_DELAY))
    return max(0.0, delay - (now - found["last"]).total_seconds())


class LoginThrottleHandler(AxesDatabaseHandler):
    """Axes compares one number with one limit; ours has two (AXES_LOCKOUT_PARAMETERS: the name at the address,
    then the address), so the address count is scaled to the name's:

    f(name, address) ≥ N_name  or  f(address) ≥ N_address  ⇔  max(f_pair, ⌊f_addr·N_name / N_address⌋) ≥ N_name

    and the address count does not hold back a name that signed in from that address before (`_known_here`).
    """

    def get_failures(self, request, credentials: dict | None = None) -> int:
        by_pair, by_address = (
            attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0
            for attempts in self.get_user_attempts(request, credentials)
        )
        if by_address and _known_here(attempted_username(request, credentials), getattr(request, "axes_ip_address", "")):
            by_address = 0
        per_name = settings.FXPILOT_LOGIN_FAILURES_PER_NAME
        per_address = settings.FXPILOT_LOGIN_FAILURES_PER_ADDRESS
        if account_wait(attempted_username(request, credentials)) > 0:
            return per_name
        return max(by_pair, by_address * per_name // per_address)


def lockout_response(request: HttpRequest, original_response=None, credentials: dict | None = None) -> HttpResponse:
    """The login page again, saying how long to wait, with HTTP 429."""
    name = attempted_username(request, credentials)
    form = AuthenticationForm(request, initial={"username": name})
    wait = account_wait(name)
    if wait > 0:
        message = _("Too many failed attempts for this account. Wait %(seconds)s seconds and try again.") % {
            "seconds": max(1, round(wait))}
    else:
        message = _("Too many failed attempts. Wait %(minutes)s minutes and try again.") % {
            "minutes": settings.FXPILOT_LOGIN_LOCKOUT_MINUTES
        }
    return render(
        request,
        "registration/login.html",
        {"form": form, "throttled": message, "next": request.POST.get("next", "")},
        status=429,
    )
