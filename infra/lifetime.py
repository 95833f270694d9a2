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

`start_watcher()` covers what a death signal cannot reach: everything a process starts, in any session,
also through an SSH server, ends with it (each test session starts one: tests/envsetup.py).
Standard library only; `python infra/lifetime.py watch …` is the watcher process itself.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

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


# --- A watcher: a whole tree of processes ends with the process that started it ---------------------------------
#
# A death signal reaches one process, a child; not what a child started in a session of its own, nor what an SSH
# server started on a node for it. `start_watcher()` starts a small process, in a session of its own, that waits
# for the process that started it to end (SIGKILL included) and then ends:
#   * every process whose environment carries the watcher's token in WATCHED_BY: the token is added to the
#     starting process's own environment, so whatever it starts afterwards inherits it, through new sessions,
#     double forks and daemons alike; an environment built from scratch passes it on (`watched_environment()`:
#     an SSH server's SetEnv; runners.processes' for the simulated nodes' sandbox);
#   * every process named in a file that matches a pattern given to `watch_files()` (a pid file, a process group
#     file), with its group, if it started after the watcher: for processes whose environment cannot be read
#     back (PostgreSQL, Redis and OpenSSH overwrite it with their process titles).
# SIGTERM first to all of them, then SIGKILL, after a grace period, to whatever is left, until nothing is.

WATCHED_BY = "FXPILOT_WATCHED_BY"          # comma-separated tokens of the watchers a process ends with
WATCH_FILES = "FXPILOT_WATCH_FILES"        # the innermost watcher's list of file patterns (one a line)
# Python's setproctitle (vLLM uses it) overwrites /proc/PID/environ with the title unless SPT_NOENV is set.
KEEP_ENVIRONMENT = "SPT_NOENV"


def start_watcher(folder: str | os.PathLike, *, grace: float = 8.0, limit: float = 20.0,
                  remove_folder: bool = False) -> str:
    """Start the watcher of this process; returns its token. Call it before starting anything it must end.

    With `remove_folder` the watcher also removes `folder` (its own files are in it) once it has ended everything,
    and only then: a folder a process it could not end may still write to stays (a test session's scratch data)."""
    token = secrets.token_hex(6)
    Path(folder).mkdir(parents=True, exist_ok=True)
    registry = Path(folder) / f"watcher-{token}.files"
    registry.touch()
    env = {key: value for key, value in os.environ.items() if key not in (WATCHED_BY, WATCH_FILES)}
    with open(Path(folder) / f"watcher-{token}.log", "ab") as log:
        # -I: the standard library only, whatever the environment says
        proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "watch", str(os.getpid()), token,
                                 str(registry), str(grace), str(limit), "remove" if remove_folder else "keep"],
                                env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)
    _watchers.append(proc)  # kept: a Popen collected while its process runs warns
    os.environ[WATCHED_BY] = ",".join(filter(None, [os.environ.get(WATCHED_BY, ""), token]))
    os.environ[WATCH_FILES] = str(registry)
    os.environ.setdefault(KEEP_ENVIRONMENT, "1")
    return token


_watchers: list = []


def watched_environment() -> dict[str, str]:
    """What an environment built from scratch must carry so that the watchers of this process still end what runs
    in it (empty when nothing watches this process)."""
    return {key: os.environ[key] for key in (WATCHED_BY, KEEP_ENVIRONMENT) if os.environ.get(key)}


def watch_files(pattern: str | os.PathLike) -> bool:
    """Have this process's watcher also end, with their groups, the processes whose pids are the first number of
    the files matching `pattern` (a glob, read when the watcher acts); False when no watcher watches this process."""
    registry = os.environ.get(WATCH_FILES)
    if not registry:
        return False
    with open(registry, "a", encoding="utf-8") as handle:
        handle.write(os.fspath(pattern) + "\n")
    return True


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks since boot) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[2]), int(fields[19])


def _processes() -> dict[int, tuple[str, int, int]]:
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            found = _stat(int(name))
            if found is not None and found[0] not in ("Z", "X"):  # a zombie has ended already
                table[int(name)] = found
    return table


def carries(pid: int, token: str) -> bool:
    """Does process `pid` carry `token` in WATCHED_BY?"""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read()
    except OSError:
        return False
    prefix = WATCHED_BY.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return token.encode() in entry[len(prefix):].split(b",")
    return False


def watched(token: str, patterns: list[str] = (), since: int = 0) -> list[int]:
    """The live processes a watcher ends: those carrying `token`, and those named in files matching `patterns`
    (each with its group) that started at or after `since` (clock ticks since boot)."""
    table = _processes()
    found = {pid for pid in table if carries(pid, token)}
    for pattern in patterns:
        for path in glob.glob(pattern):
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    named = int(handle.readline().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            found |= {pid for pid, (_, group, started) in table.items()
                      if (pid == named or group == named) and started >= since and named > 1}
    found.discard(os.getpid())
    return sorted(found)


def end_watched(token: str, patterns: list[str] = (), *, since: int = 0, grace: float = 8.0,
                limit: float = 20.0) -> list[int]:
    """SIGTERM every watched process, SIGKILL what is left after `grace` seconds, again until none is left (or
    `limit` seconds have passed); returns the pids signalled."""
    def send(pids, sig) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    started = time.monotonic()
    first = watched(token, patterns, since)
    send(first, signal.SIGTERM)
    signalled = set(first)
    while time.monotonic() - started < grace and watched(token, patterns, since):
        time.sleep(0.2)
    while time.monotonic() - started < limit:
        left = watched(token, patterns, since)
        if not left:
            break
        send(left, signal.SIGKILL)
        signalled.update(left)
        time.sleep(0.1)
    return sorted(signalled)


def _wait_for_end(parent: int) -> None:
    """Return once `parent` (this process's parent) has ended."""
    try:
        handle = os.pidfd_open(parent)
    except (AttributeError, OSError):
        handle = None
    if os.getppid() != parent:  # it ended already (the pidfd, if any, may name another process)
        return
    if handle is not None:
        select.select([handle], [], [])
        os.close(handle)
        return
    while os.getppid() == parent:
        time.sleep(0.5)


def _watch(parent: int, token: str, registry: str, grace: float, limit: float, remove: bool = False) -> None:
    # Only the parent's end stops the watcher: not a Ctrl-C to the terminal, not a hang-up.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    since = _stat(os.getpid())[2]
    _wait_for_end(parent)
    try:
        with open(registry, encoding="utf-8") as handle:
            patterns = [line.strip() for line in handle if line.strip()]
    except OSError:
        patterns = []
    began = time.monotonic()
    ended = end_watched(token, patterns, since=since, grace=grace, limit=limit)
    left = watched(token, patterns, since)
    print(f"watcher {token}: process {parent} ended; signalled {len(ended)} process(es) {ended} in "
          f"{time.monotonic() - began:.1f} s" + (f"; still running: {left}" if left else ""), flush=True)
    if remove and not left:
        shutil.rmtree(os.path.dirname(registry), ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "watch" and sys.argv[7] in ("remove", "keep"):
        _watch(int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]), float(sys.argv[6]),
               remove=sys.argv[7] == "remove")
    else:
        sys.exit("usage: lifetime.py watch PARENT_PID TOKEN REGISTRY GRACE LIMIT remove|keep")
