"""Process groups: what is left of a child that ended goes with it.

Standard library only, so that both the Django side (the demo) and the simulated node
(runners/simnode, which imports nothing of the Django project) may use it.
"""
from __future__ import annotations

import os
import signal
import subprocess

# What an environment built from scratch (a simulated node's commands) passes on, so that what runs in it still ends
# with the process that watches this one: infra.lifetime's WATCHED_BY and KEEP_ENVIRONMENT (infra.lifetime itself
# is out of the simulated node's reach: importing it imports the fxpilot package, its Celery app).
WATCH_VARIABLES = ("FXPILOT_WATCHED_BY", "SPT_NOENV")


def watched_environment() -> dict[str, str]:
    """The WATCH_VARIABLES this process has (none when nothing watches it)."""
    return {name: os.environ[name] for name in WATCH_VARIABLES if os.environ.get(name)}


def kill_group(proc: subprocess.Popen, wait: float = 5.0) -> None:
    """SIGKILL the process group of a child started with ``start_new_session=True`` (its pid is the group's
    id) — the child and whatever it left in its group, e.g. a dead worker's pool processes — then reap the
    child, waiting at most ``wait`` seconds."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        pass
