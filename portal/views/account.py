"""A person's own account: the account page (their API tokens: made with an expiry, listed, revoked), and changing
or resetting the password with Django's own views (mail through the configured EMAIL_BACKEND).

A reset link is asked for by e-mail address, and the answer is the same page whether an account has that address or
not; the mail itself is rendered in the request (in the person's own language) and handed to the mail backend on a
thread of its own, so neither the answer nor its time says whether it was sent. The link's token is Django's
(signed with SECRET_KEY, good for PASSWORD_RESET_TIMEOUT, spent once the password changes) and never goes through
the broker."""
from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import PasswordResetForm
from django.core.cache import cache
from django.core.mail import EmailMultiAlternatives
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template import loader
from django.urls import reverse_lazy
from django.utils import translation
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from gates.models import API_TOKEN_MAX_DAYS, ApiToken, Profile, api_token_days
from portal.signin import client_address

log = logging.getLogger(__name__)

TOKEN_DAYS = (7, 30, 90, 180, 365)


class TokenForm(forms.Form):
    name = forms.CharField(label=gettext_lazy("What it is for"), max_length=100)
    days = forms.TypedChoiceField(label=gettext_lazy("Valid for"), coerce=int)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        default = api_token_days()
        days = sorted({d for d in TOKEN_DAYS if d <= API_TOKEN_MAX_DAYS} | {default})
        self.fields["days"].choices = [(d, translation.ngettext("%(n)d day", "%(n)d days", d) % {"n": d})
                                       for d in days]
        self.fields["days"].initial = default


def _account_page(request: HttpRequest, form: TokenForm | None = None, new_key: str = "",
                  new_token: ApiToken | None = None, status: int = 200) -> HttpResponse:
    tokens = list(ApiToken.objects.filter(user=request.user).order_by("-created"))
    return render(request, "registration/account.html", {
        "tokens": tokens, "form": form or TokenForm(), "new_key": new_key, "new_token": new_token,
        "default_days": api_token_days(),
    }, status=status)


@login_required
def account(request: HttpRequest) -> HttpResponse:
    return _account_page(request)


@login_required
@require_POST
def token_create(request: HttpRequest) -> HttpResponse:
    """A new token for the person themselves; shown once, on this answer only (never stored, put in a message or
    a session)."""
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _account_page(request, form=form, status=400)
    token, key = ApiToken.issue(request.user, form.cleaned_data["name"], days=form.cleaned_data["days"])
    response = _account_page(request, new_key=key, new_token=token)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=pk, user=request.user)  # only one's own: anyone else's is 404
    if token.revoke():
        messages.success(request, _("The token %(prefix)s… is revoked; the API refuses it from now on.")
                         % {"prefix": token.prefix})
    return redirect("account")


# ── The password: change and reset (Django's views, our templates) ─────────────────────────────────────────────


def _send_in_background(message: EmailMultiAlternatives) -> None:
    def send() -> None:
        try:
            message.send()
        except Exception as exc:  # noqa: BLE001 — the person was already answered; say what failed, not the link
            log.warning("password reset mail to a person could not be sent: %s", type(exc).__name__)

    thread = threading.Thread(target=send, name="password-reset-mail", daemon=True)
    SENDING.append(thread)
    thread.start()


# The threads sending reset mails (tests wait for them; a finished one is dropped at the next send).
SENDING: list[threading.Thread] = []


class ResetForm(PasswordResetForm):
    """Django's: a mail only to an active account with that address and a usable password, and the same answer
    either way. The mail is in the person's own language and is handed to the backend off the request."""

    def send_mail(self, subject_template_name, email_template_name, context, from_email, to_email,
                  html_email_template_name=None):
        SENDING[:] = [thread for thread in SENDING if thread.is_alive()]
        user = context.get("user")
        language = Profile.objects.filter(user=user).values_list("language", flat=True).first() or \
            translation.get_language()
        with translation.override(language):
            subject = "".join(loader.render_to_string(subject_template_name, context).splitlines())
            body = loader.render_to_string(email_template_name, context)
        _send_in_background(EmailMultiAlternatives(subject, body, from_email, [to_email]))


def _site() -> tuple[str, bool]:
    """The portal's own address for the link (SITE_URL), never the Host header a request brought."""
    parts = urlsplit(settings.SITE_URL)
    return parts.netloc, parts.scheme == "https"


RESET_WINDOW_SECONDS = 3600


def reset_key(kind: str, value: str) -> str:
    """The cache key of a reset count: a keyed hash of the value, never the value."""
    digest = hmac.new(settings.SECRET_KEY.encode(), f"{kind}:{value}".encode(), hashlib.sha256).hexdigest()[:32]
    return f"password-reset:{kind}:{digest}"


def _counted(kind: str, value: str) -> int:
    """Reset requests for `value` (an address, a client) in the current hour, this one included. The cache holds
    a keyed hash of the value, never the value; with Redis (FXPILOT_CACHE_URL) every portal process shares the
    count, with the local default each process counts its own."""
    key = reset_key(kind, value)
    cache.add(key, 0, RESET_WINDOW_SECONDS)
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, RESET_WINDOW_SECONDS)
        return 1


def reset_allowed(request: HttpRequest, email: str) -> bool:
    """Whether a reset request may send a mail: at most FXPILOT_RESET_MAILS_PER_ADDRESS to one address and
    FXPILOT_RESET_REQUESTS_PER_CLIENT from one client address (portal.signin.client_address) an hour, so that
    nobody can fill a person's mailbox or walk the address book through the form. Both counts move on every
    request. Past either, the form answers as always (it never says whether an account exists) and sends nothing."""
    client = client_address(request)
    per_address = _counted("address", email.strip().lower())
    per_client = _counted("client", client)
    if per_address <= settings.FXPILOT_RESET_MAILS_PER_ADDRESS and per_client <= settings.FXPILOT_RESET_REQUESTS_PER_CLIENT:
        return True
    log.warning("password reset from %s not sent: %s", client,
                "too many for that address this hour" if per_address > settings.FXPILOT_RESET_MAILS_PER_ADDRESS
                else "too many requests from that client this hour")
    return False


class PasswordResetView(auth_views.PasswordResetView):
    form_class = ResetForm
    template_name = "registration/password_reset_form.html"
    email_template_name = "registration/password_reset_email.txt"
    subject_template_name = "registration/password_reset_subject.txt"
    success_url = reverse_lazy("password_reset_done")

    def form_valid(self, form):
        if not reset_allowed(self.request, form.cleaned_data["email"]):
            return redirect(self.success_url)
        domain, https = _site()
        form.save(domain_override=domain, use_https=https, request=self.request, from_email=self.from_email,
                  email_template_name=self.email_template_name, subject_template_name=self.subject_template_name,
                  token_generator=self.token_generator, extra_email_context={"site_name": "fxpilot"})
        return redirect(self.success_url)


password_reset = PasswordResetView.as_view()
password_reset_done = auth_views.PasswordResetDoneView.as_view(template_name="registration/password_reset_done.html")
password_reset_confirm = auth_views.PasswordResetConfirmView.as_view(
    template_name="registration/password_reset_confirm.html", success_url=reverse_lazy("password_reset_complete"))
password_reset_complete = auth_views.PasswordResetCompleteView.as_view(
    template_name="registration/password_reset_complete.html")
password_change = auth_views.PasswordChangeView.as_view(
    template_name="registration/password_change_form.html", success_url=reverse_lazy("password_change_done"))
password_change_done = auth_views.PasswordChangeDoneView.as_view(
    template_name="registration/password_change_done.html")
