"""The runners app. Its ready() registers the gate-run step kinds (runners.steps) with runners.kinds, and the
site agents' route (runners.agentlink.route) with runners.ssh, which must not import it (agentlink is built on it).

runners.steps and runners.agentlink import models (of both apps), so they can only be imported once the app
registry is ready: that is why the imports are inside ready(), the one place Django runs code at that moment.
"""
from django.apps import AppConfig


class RunnersConfig(AppConfig):
    name = "runners"
    verbose_name = "Runners"

    def ready(self) -> None:
        from runners.agentlink import route
        from runners.kinds import register_kind
        from runners.ssh import add_route
        from runners.steps import GATE_RUN_KINDS

        for kind in GATE_RUN_KINDS:
            register_kind(kind)
        add_route(route)
