"""infra.lifetime with real processes: a process group whose parent dies is gone after its grace period even
when it ignores the death signal, and a forked child with a death signal does not outlive its parent."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# parent → leader (own session; ignores SIGTERM; watches its parent) → member (same group, just sleeps)
PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    from infra.lifetime import die_with_parent
    leader = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())], start_new_session=True,
                              preexec_fn=die_with_parent(), stdout=sys.stdout)
    time.sleep(600)
""")
LEADER = textwrap.dedent("""
    import os, signal, sys, time
    from infra.lifetime import stop_group_when_orphaned
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # an orderly stop that never ends
    member = os.fork()
    if member == 0:
        time.sleep(600)
        os._exit(0)
    stop_group_when_orphaned(int(sys.argv[1]), grace=0.5, poll=0.1)
    print(os.getpid(), member, flush=True)
    time.sleep(600)
""")
# parent → forked child with a death signal (as Celery forks its embedded beat)
FORKS = textwrap.dedent("""
    import os, time
    from infra.lifetime import set_death_signal
    child = os.fork()
    if child == 0:
        set_death_signal(9)
        time.sleep(600)
        os._exit(0)
    print(child, flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


def _start(code: str, *args: str) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    return proc, [int(pid) for pid in proc.stdout.readline().split()]


def test_a_group_that_ignores_its_death_signal_is_killed_after_the_grace_period():
    parent, pids = _start(PARENT, LEADER)
    try:
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        time.sleep(1.0)
        assert all(_alive(pid) for pid in pids)  # the watch does nothing while the parent lives
        parent.kill()
        parent.wait(600)
        assert _gone(pids, 600) == []
    finally:
        for pid in [parent.pid, *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_forked_child_with_a_death_signal_does_not_outlive_its_parent():
    parent, (child,) = _start(FORKS)
    try:
        assert _alive(child)
        parent.kill()
        parent.wait(600)
        assert _gone([child], 600) == []
    finally:
        for pid in (parent.pid, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
