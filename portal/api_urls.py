from django.urls import path, re_path

from portal import api

urlpatterns = [
    path("openapi.json", api.openapi, name="api-openapi"),
    path("v1/pilots", api.pilots, name="api-pilots"),
    path("v1/pilots/<uuid:pilot>", api.pilot_detail, name="api-pilot"),
    path("v1/pilots/<uuid:pilot>/gates", api.gates, name="api-gates"),
    path("v1/pilots/<uuid:pilot>/gates/<int:number>", api.gate_detail, name="api-gate"),
    path("v1/pilots/<uuid:pilot>/gates/<int:number>/verdicts", api.verdicts, name="api-verdicts"),
    path("v1/pilots/<uuid:pilot>/runs", api.runs, name="api-runs"),
    path("v1/pilots/<uuid:pilot>/reports", api.reports, name="api-reports"),
    path("v1/runs/<uuid:run>", api.run_detail, name="api-run"),
    path("v1/runs/<uuid:run>/log", api.run_log, name="api-run-log"),
    path("v1/runs/<uuid:run>/artifacts", api.run_artifacts, name="api-run-artifacts"),
    path("v1/runs/<uuid:run>/results", api.run_results_view, name="api-run-results"),
    path("v1/artifacts/<uuid:artifact>/download", api.artifact_download, name="api-artifact-download"),
    path("v1/reports/<uuid:report>/download", api.report_download, name="api-report-download"),
    # Anything else under /api/ (including ids that are not UUIDs) answers a JSON 404.
    re_path(r"^.*$", api.not_found),
]
