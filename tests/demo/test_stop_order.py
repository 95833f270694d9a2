"""How the demo stops what it started (portal.management.commands.demo.Processes), with real processes standing in
for its services: the broker gets SIGTERM only once everything else has exited, the site agent is asked twice and
leaves at once, and what does not stop on SIGTERM is killed and named."""
from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

from portal.management.commands.demo import Processes

# Writes "<name> term <time>" when it gets SIGTERM and "<name> exit <time>" when it exits, `delay` seconds later.
SERVICE = textwrap.dedent("""
    import signal, sys, time
    name, delay, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    def on_term(signum, frame):
        with open(out, "a") as f:
            f.write(f"{name} term {time.time()}\\n")
        time.sleep(delay)
        with open(out, "a") as f:
            f.write(f"{name} exit {time.time()}\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    while True:
        time.sleep(0.1)
""")
# The site agent's way: the first SIGTERM logs "taking no new work" and waits 60 s; a second leaves at once.
AGENT = textwrap.dedent("""
    import signal, sys, time
    asked = []
    def on_term(signum, frame):
        if asked:
            print("again: leaving now", flush=True)
            sys.exit(0)
        asked.append(time.time())
        print("SIGTERM: taking no new work", flush=True)
    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    while not asked or time.time() - asked[0] < 60:
        time.sleep(0.1)
""")
STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(600)\n"


def _started(processes: Processes, log_dir: Path) -> None:
    deadline = time.monotonic() + 600
    names = [name for name, _ in processes.running]
    while not all("ready" in (log_dir / f"{name}.log").read_text() for name in names):
        assert time.monotonic() < deadline, {n: (log_dir / f"{n}.log").read_text() for n in names}
        time.sleep(0.05)


def _events(out: Path) -> dict[tuple[str, str], float]:
    return {(name, what): float(at) for name, what, at in (line.split() for line in out.read_text().splitlines())}


def test_the_broker_stops_last_and_the_agent_is_asked_twice(tmp_path):
    out = tmp_path / "events"
    processes = Processes(tmp_path, say=lambda *_: None)
    processes.start("broker", [sys.executable, "-c", SERVICE, "broker", "0", str(out)])
    processes.start("worker", [sys.executable, "-c", SERVICE, "worker", "1.0", str(out)])  # says goodbye for 1 s
    processes.start("agent", [sys.executable, "-c", AGENT])
    _started(processes, tmp_path)
    seconds, killed = processes.stop()
    events = _events(out)
    assert killed == []
    assert events[("broker", "term")] >= events[("worker", "exit")], events
    assert "again: leaving now" in (tmp_path / "agent.log").read_text()
    assert seconds < processes.STOP_SECONDS  # neither the agent's 60 s nor the kill deadline was waited for
    assert processes.running == []


def test_what_does_not_stop_on_sigterm_is_killed_and_named(tmp_path):
    processes = Processes(tmp_path, say=lambda *_: None)
    processes.STOP_SECONDS = 1
    stubborn = processes.start("simnodes", [sys.executable, "-c", STUBBORN])
    processes.start("worker", [sys.executable, "-c", SERVICE, "worker", "0", str(tmp_path / "events")])
    _started(processes, tmp_path)
    _, killed = processes.stop()
    assert killed == ["simnodes"]
    assert stubborn.poll() is not None
