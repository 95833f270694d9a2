"""The kinds of step a gate run is made of (probe, deploy, workload, collect, teardown, evaluate, report)."""
from __future__ import annotations
