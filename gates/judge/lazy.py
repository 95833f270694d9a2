"""pandas and scipy, imported when the judge first computes with them rather than when a process starts.

Every Django process (a Celery worker, a portal worker, each `manage.py` command) loads the judge with the app
registry (runners.apps registers the gate-run steps, which judge runs); importing pandas and scipy.stats there cost
about 1.4 s of CPU per process start (measured: `python -c "import pandas, scipy.stats"`, 1.37 s user on an idle
core; `django.setup()` 2.4 s in all). Most of those processes never judge anything: a worker that only deploys, a
`verify_report`, a simulated node. `pd`, `stats`, `optimize` and `special` here stand for the modules and import them on
first use; attribute access after that costs a dictionary lookup.
"""
from __future__ import annotations

import importlib


class LazyModule:
    """A module imported at its first attribute access."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"


pd = LazyModule("pandas")
stats = LazyModule("scipy.stats")
optimize = LazyModule("scipy.optimize")
special = LazyModule("scipy.special")
