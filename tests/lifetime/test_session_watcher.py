"""Every process a test session starts ends with it, even when its pytest is killed with SIGKILL (tests/envsetup.py
starts each pytest process's watcher: infra.lifetime.start_watcher).

A pytest of its own runs tests/lifetime/session.py, whose test starts a Celery worker with its pool, OpenSSH's sshd
and a process detached over it (as deploy.sh's vLLM servers are), a simulated node and a process detached on it, and
a process without the mark named in a pid file. That pytest is killed with SIGKILL — the one process, or
pytest-xdist's controller — and 30 s later none of the processes it made may be left, nor any carrying its mark,
nor the data folder the session made for itself.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.lifetime import WATCHED_BY

REPO = Path(__file__).resolve().parents[2]
SESSION = REPO / "tests" / "lifetime" / "session.py"
WITHIN_S = 600


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"  # a zombie has ended; it waits for its parent (or PID 1) to collect it


def _carrying(tokens: set[str]) -> dict[int, str]:
    """Live processes whose environment names one of `tokens` in FXPILOT_WATCHED_BY, with their command lines
    (read here from /proc, not through the code under test)."""
    needle = WATCHED_BY.encode() + b"="
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not _alive(int(entry.name)):
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        marks = {m.decode() for e in environ if e.startswith(needle) for m in e[len(needle):].split(b",")}
        if marks & tokens:
            found[int(entry.name)] = cmdline[:160]
    return found


def _environment(probe: Path) -> dict[str, str]:
    """This session's environment for a new session of its own: no xdist worker identity, its own data folder and
    its own embedded broker (one more server it starts)."""
    dropped = ("FXPILOT_DATA_DIR", "FXPILOT_WATCH_FILES", "CELERY_BROKER_URL", "FXPILOT_TEST_EMBEDDED_BROKER")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k not in dropped}
    env["FXPILOT_LIFETIME_PROBE"] = str(probe)
    return env


def _wait_for(probe: Path, inner: subprocess.Popen, log: Path, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while not probe.exists():
        if inner.poll() is not None:
            raise AssertionError(f"the session ended ({inner.returncode}) before it started everything:\n"
                                 + log.read_text(errors="replace")[-4000:])
        if time.monotonic() > deadline:
            raise AssertionError(f"hung: the session did not start everything in {timeout:g} s:\n"
                                 + log.read_text(errors="replace")[-4000:])
        time.sleep(0.2)
    return json.loads(probe.read_text())


@pytest.mark.parametrize("xdist", [False, True], ids=["pytest", "xdist-controller"])
def test_what_a_session_started_ends_when_its_pytest_is_killed(tmp_path, xdist):
    probe, log = tmp_path / "probe.json", tmp_path / "session.log"
    argv = [sys.executable, "-m", "pytest", str(SESSION), "-p", "no:cacheprovider", "-q", *(["-n", "1"] if xdist else [])]
    with open(log, "wb") as out:
        inner = subprocess.Popen(argv, cwd=REPO, env=_environment(probe), stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    made: list[int] = []
    ours: set[str] = set()
    try:
        facts = _wait_for(probe, inner, log)
        made = [pid for pids in facts["pids"].values() for pid in pids]
        ours = set(facts["mark"].split(",")) - set(os.environ.get(WATCHED_BY, "").split(","))
        assert len(ours) == (2 if xdist else 1), facts["mark"]
        assert (facts["pytest"] != inner.pid) is xdist  # under xdist the test ran in the worker, not the controller
        assert all(_alive(pid) for pid in made), facts
        assert len(facts["pids"]["worker"]) >= 2 and facts["pids"]["broker"], facts  # the worker's pool; a broker
        # The mark reaches what runs over sshd and on a simulated node, though both give their commands a fresh
        # environment; the process started with `env -i` carries none (its pid file names it).
        carrying = _carrying(ours)
        for name in ("worker", "sshd-detached", "simnode-detached"):
            assert set(facts["pids"][name]) <= set(carrying), (name, facts["pids"][name], carrying)
        assert facts["pids"]["unmarked"][0] not in carrying

        os.kill(inner.pid, signal.SIGKILL)
        inner.wait(600)
        deadline = time.monotonic() + WITHIN_S
        while time.monotonic() < deadline and (any(map(_alive, made)) or _carrying(ours)):
            time.sleep(0.2)
        left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                for pid in made if _alive(pid)}
        left.update(_carrying(ours))
        assert not left, f"hung: {WITHIN_S} s after pytest was killed these are still running: {left}"
        # The data folder the session made (the test's own under xdist) goes once its watcher has ended all of it.
        data = Path(facts["data"])
        assert data.name.startswith("fxpilot-test-")
        while time.monotonic() < deadline + 10 and data.exists():
            time.sleep(0.2)
        assert not data.exists(), sorted(p.name for p in data.iterdir())
    finally:
        for pid in [inner.pid, *made, *_carrying(ours)]:  # a failing test leaves nothing behind either
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        inner.wait(600)


def test_the_simulated_node_passes_on_the_variables_the_watcher_reads():
    """runners/processes.py names them again (the simulated node cannot import infra.lifetime): the same names."""
    from infra.lifetime import KEEP_ENVIRONMENT
    from runners.processes import WATCH_VARIABLES

    assert set(WATCH_VARIABLES) == {WATCHED_BY, KEEP_ENVIRONMENT}


WATCHED_ONLY = """
import sys
from infra.lifetime import start_watcher
start_watcher(sys.argv[1], remove_folder=sys.argv[2] == "remove")
"""


@pytest.mark.parametrize("what", ["remove", "keep"])
def test_a_watcher_removes_its_folder_once_its_process_ended_only_when_asked(tmp_path, what):
    folder = tmp_path / "data"
    subprocess.run([sys.executable, "-c", WATCHED_ONLY, str(folder), what], cwd=REPO, check=True, timeout=600,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + WITHIN_S
    log = lambda: (list(folder.glob("watcher-*.log")) or [None])[0]  # noqa: E731
    # the watcher's line saying it acted: the folder's end when asked, else the folder with its log kept
    while time.monotonic() < deadline and folder.exists() and not (log() and "ended" in log().read_text()):
        time.sleep(0.1)
    if what == "remove":
        assert not folder.exists()
    else:
        assert folder.exists() and "signalled 0 process(es)" in log().read_text()
