from django.contrib.auth import views as auth_views
from django.urls import path

from gates import views

urlpatterns = [
    path("", views.home, name="home"),
    path("accounts/login/", views.ThrottledLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("language/", views.set_language, name="set_language"),
    path("notifications/read/", views.notifications_read, name="notifications_read"),
    path("pilots/new/", views.pilot_new, name="pilot_new"),
    path("pilots/<uuid:code>/", views.pilot_detail, name="pilot"),
    path("pilots/<uuid:code>/plan/", views.plan_detail, name="plan"),
    path("pilots/<uuid:code>/plan/criteria/<slug:key>/", views.criterion_edit, name="criterion_edit"),
    path("pilots/<uuid:code>/plan/sample-trace/", views.plan_sample_trace, name="plan_sample_trace"),
    path("pilots/<uuid:code>/plan/sign/", views.plan_sign, name="plan_sign"),
    path("pilots/<uuid:code>/plan/amend/", views.plan_amend, name="plan_amend"),
    path("pilots/<uuid:code>/gates/<int:number>/", views.gate_detail, name="gate"),
    path("pilots/<uuid:code>/gates/<int:number>/signoff/", views.gate_signoff, name="gate_signoff"),
    path("pilots/<uuid:code>/gates/<int:number>/trace/", views.gate_trace, name="gate_trace"),
    path("pilots/<uuid:code>/gates/<int:number>/trace/<int:trace>/", views.gate_trace_download,
         name="gate_trace_download"),
    path("pilots/<uuid:code>/gates/<int:number>/extend/", views.gate_extend, name="gate_extend"),
    path("pilots/<uuid:code>/reports/", views.reports_list, name="reports"),
    path("pilots/<uuid:code>/audit/", views.audit_log, name="audit"),
    path("reports/<uuid:code>/download/", views.report_download, name="report_download"),
    path("reports/verify/", views.report_verify, name="report_verify"),
    path("reports/verify/<uuid:code>/", views.report_verification, name="report_verification"),
    path("reports/<uuid:code>/countersign/", views.report_countersign, name="report_countersign"),
    path("pilots/<uuid:code>/procurement/", views.procurement_make, name="procurement_make"),
    path("reports/<uuid:code>/check/", views.report_check, name="report_check"),
]
