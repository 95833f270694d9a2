"""The runners app. Its ready() registers the gate-run step kinds (runners.steps) with runners.kinds.

runners.steps imports models (of both apps), so it can only be imported once the app registry is
ready: that is why the import is inside ready(), the one place Django runs code at that moment.
"""
from django.apps import AppConfig


class RunnersConfig(AppConfig):
    name = "runners"
    verbose_name = "Runners"

    def ready(self) -> None:
        from runners.kinds import register_kind
        from runners.steps import GATE_RUN_KINDS

        for kind in GATE_RUN_KINDS:
            register_kind(kind)
