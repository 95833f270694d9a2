"""Child processes that do not outlive their parent.

`die_with_parent()` gives subprocess.Popen a preexec_fn that asks Linux (prctl PR_SET_PDEATHSIG)
to send the child SIGTERM when the thread that started it ends — also when the parent is killed
with SIGKILL and has no chance to clean up. Start such children from the main thread.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM):
    parent = os.getpid()
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def preexec() -> None:
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec
