"""Small request/response middleware of the portal: a Content-Security-Policy and the person's language."""

from __future__ import annotations

import re
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import translation

from gates.models import LANGUAGE_SESSION_KEY
from runners.validators import trace_max_bytes

# Only our own scripts and styles: no inline script, no CDN (the portal must work on an isolated network).
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
# Above this, a request is refused before its body is read (uploads are a PDF to verify or an SSH key).
MAX_BODY_BYTES = 128 * 1024 * 1024
# The site agents' API (runners.agentapi) sets its own limits: 1 MiB a request, a collected file up to
# FXPILOT_AGENT_MAX_FILE (streamed to disk, never held in memory).
AGENT_API_PREFIX = "/agent/v1/"
# A customer's trace may be a day of traffic (hundreds of MB): its two upload addresses take up to the trace limit
# (runners.validators.trace_max_bytes) plus room for the form around it; the upload is streamed to a temporary file.
TRACE_UPLOAD_PATH = re.compile(r"^/pilots/[0-9a-f-]{36}/(traces/upload|gates/\d+/trace)/$")
TRACE_FORM_ROOM = 1024 * 1024


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not request.path.startswith("/admin/"):
            response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response


class RequestSizeLimitMiddleware:
    """Refuse an oversized body by its Content-Length, before CSRF or upload handling would read it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response
        self.limit = getattr(settings, "FXPILOT_MAX_REQUEST_BYTES", MAX_BODY_BYTES)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(AGENT_API_PREFIX):
            return self.get_response(request)
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return HttpResponse("Bad Content-Length.", status=400, content_type="text/plain")
        limit = self.limit
        if request.method == "POST" and TRACE_UPLOAD_PATH.match(request.path):
            limit = max(limit, trace_max_bytes() + TRACE_FORM_ROOM)
        if length > limit:
            return HttpResponse(
                f"The request is larger than {limit // 2**20} MB.", status=413, content_type="text/plain"
            )
        return self.get_response(request)


class PersonLanguageMiddleware:
    """After LocaleMiddleware and auth: the language a signed-in person chose wins over the browser's."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response
        self.known = {code for code, _name in settings.LANGUAGES}

    def __call__(self, request: HttpRequest) -> HttpResponse:
        chosen = request.session.get(LANGUAGE_SESSION_KEY) if hasattr(request, "session") else None
        if chosen in self.known and getattr(request, "user", None) is not None and request.user.is_authenticated:
            translation.activate(chosen)
            request.LANGUAGE_CODE = chosen
        response = self.get_response(request)
        response.headers.setdefault("Content-Language", translation.get_language())
        return response


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: the API answers JSON (its clients are programs); pages keep Django's explanation."""
    if request.path.startswith("/api/"):
        from django.http import JsonResponse

        return JsonResponse(
            {"error": f"refused: {reason or 'CSRF check failed'}; the API is read-only (GET) and takes a Bearer token"},
            status=403,
        )
    from django.views.csrf import csrf_failure as django_csrf_failure

    return django_csrf_failure(request, reason=reason)
