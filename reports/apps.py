"""The reports app. Its ready() registers the report step kind (reports.steps) with runners.kinds.

reports.steps imports models, so it can only be imported once the app registry is ready: that is why
the import is inside ready(), the one place Django runs code at that moment.
"""
from django.apps import AppConfig


class ReportsConfig(AppConfig):
    name = "reports"
    verbose_name = "Reports"

    def ready(self) -> None:
        from reports.steps import REPORT_KINDS
        from runners.kinds import register_kind

        for kind in REPORT_KINDS:
            register_kind(kind)
