"""Login throttling on django-axes: two limits (per user name, and a higher one per address) and our page.

Attempts are rows in the database (axes' AccessAttempt), so every web process counts the same
failures and a restart forgets none; a successful login clears nothing (AXES_RESET_ON_SUCCESS is off),
so an attacker cannot reset the count with an account of their own. Once locked, the right password
is refused too, until the cool-off has passed.
"""
from __future__ import annotations

from axes.handlers.database import AxesDatabaseHandler
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext as _


def attempted_username(request: HttpRequest, credentials: dict | None) -> str:
    """The name tried, as the count knows it: trimmed and lower-cased, so 'Alice ' and 'alice' add up."""
    name = (credentials or {}).get("username")
    if name is None:
        name = request.POST.get("username", "") if request is not None else ""
    return str(name).strip().lower()[:150]


class LoginThrottleHandler(AxesDatabaseHandler):
    """Axes compares one number with one limit; ours has two, so the address count is scaled to the name's.

    failures(name) ≥ N_name  or  failures(address) ≥ N_address  ⇔  max(f_name, ⌊f_addr·N_name / N_address⌋) ≥ N_name
    """

    def get_failures(self, request, credentials: dict | None = None) -> int:
        by_name, by_address = (
            attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0
            for attempts in self.get_user_attempts(request, credentials)
        )
        per_name = settings.FXPILOT_LOGIN_FAILURES_PER_NAME
        per_address = settings.FXPILOT_LOGIN_FAILURES_PER_ADDRESS
        return max(by_name, by_address * per_name // per_address)


def lockout_response(request: HttpRequest, original_response=None, credentials: dict | None = None) -> HttpResponse:
    """The login page again, saying how long to wait, with HTTP 429."""
    form = AuthenticationForm(request, initial={"username": attempted_username(request, credentials)})
    message = _("Too many failed attempts. Wait %(minutes)s minutes and try again.") % {
        "minutes": settings.FXPILOT_LOGIN_LOCKOUT_MINUTES
    }
    return render(
        request,
        "registration/login.html",
        {"form": form, "throttled": message, "next": request.POST.get("next", "")},
        status=429,
    )
