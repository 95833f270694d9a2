"""Process groups: what is left of a child that ended goes with it.

Standard library only, so that both the Django side (the demo) and the simulated node
(runners/simnode, which imports nothing of the Django project) may use it.
"""
from __future__ import annotations

import os
import signal
import subprocess


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
