from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("portal.api_urls")),
    # The site agents' own API (bearer token per site; runners.agentapi): no session, no CSRF, no login page.
    path("agent/v1/", include("runners.agentapi")),
    path("", include("portal.urls")),
]
