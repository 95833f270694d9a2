"""Child processes that do not outlive their parent.

`die_with_parent()` gives subprocess.Popen a preexec_fn that asks Linux (prctl PR_SET_PDEATHSIG)
to send the child SIGTERM when the thread that started it ends — also when the parent is killed
with SIGKILL and has no chance to clean up. Start such children from the main thread.

A death signal only starts an orderly stop, and reaches only the process it was set in. Two more
pieces make sure nothing is left behind: `set_death_signal()` sets it in a process that was forked
rather than started through Popen (Celery's embedded beat, whose worker may die without stopping
it), and `stop_group_when_orphaned()` bounds how long an orderly stop may take — once the parent is
gone, the process's whole group (its pool, its beat) is killed after a grace period, whatever the
stop is waiting for (a broker that died at the same moment, a task that does not end).
Standard library only.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import threading
import time

PR_SET_PDEATHSIG = 1
# The environment variable through which a parent asks a child process group to stop when it dies
# (its value is the parent's pid); read by the Celery worker (fxpilot/celery.py).
STOP_WITH_PARENT = "FXPILOT_STOP_WITH_PARENT"


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def die_with_parent(sig: int = signal.SIGTERM):
    parent = os.getpid()
    libc = _libc()

    def preexec() -> None:
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


def set_death_signal(sig: int = signal.SIGTERM) -> None:
    """This process gets `sig` when its parent ends (a forked child: set it first thing in the child)."""
    parent = os.getppid()
    libc = _libc()
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent or parent == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def stop_group_when_orphaned(parent: int, grace: float, poll: float = 0.5) -> threading.Thread:
    """Watch, in a daemon thread, that `parent` is still this process's parent. Once it is not (it died and
    Linux gave this process another), allow `grace` seconds for the orderly stop its death signal began,
    then SIGKILL this process's group — itself and everything it started there — or only itself when it
    does not lead its group."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        time.sleep(grace)
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="stop-with-parent", daemon=True)
    thread.start()
    return thread
