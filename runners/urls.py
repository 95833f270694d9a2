from django.urls import path

from runners import views

urlpatterns = [
    path("runs/<uuid:code>/", views.run_detail, name="run"),
    path("runs/<uuid:code>/log/", views.run_log, name="run_log"),
    path("runs/<uuid:code>/cancel/", views.run_cancel, name="run_cancel"),
    path("pilots/<uuid:code>/gates/<int:number>/run/", views.run_start, name="run_start"),
    path("artifacts/<uuid:code>/download/", views.artifact_download, name="artifact_download"),
    path("pilots/<uuid:code>/sites/", views.sites, name="sites"),
    path("pilots/<uuid:code>/sites/new/", views.site_create, name="site_create"),
    path("sites/<uuid:code>/nodes/new/", views.node_create, name="node_create"),
    path("sites/<uuid:code>/credentials/new/", views.credential_create, name="credential_create"),
    path("nodes/<uuid:code>/", views.node_detail, name="node"),
    path("nodes/<uuid:code>/accept-host-key/", views.node_accept_host_key, name="node_accept_host_key"),
    path("nodes/<uuid:code>/contact/", views.node_contact, name="node_contact"),
]
