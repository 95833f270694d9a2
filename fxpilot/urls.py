from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("gates.api_urls")),
    path("", include("gates.urls")),
    path("", include("runners.urls")),
]
