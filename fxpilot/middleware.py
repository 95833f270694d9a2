"""Small request/response middleware of the portal: a Content-Security-Policy and the person's language."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import translation

# Only our own scripts and styles: no inline script, no CDN (the portal must work on an isolated network).
# style-src-attr allows the inline style attributes of server-rendered SVG charts, never a <style> or script.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "style-src-attr 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
LANGUAGE_SESSION_KEY = "fxpilot_language"


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not request.path.startswith("/admin/"):
            response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response


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
