"""`manage.py worker` stopped with SIGTERM: it stops within seconds, its pool processes and beat with it,
and what it held goes back to the queue for the next worker."""
from __future__ import annotations

import os
import signal
import sys
import time

from tests.broker.conftest import marked, wait_for_text


def test_sigterm_stops_the_worker_with_beat_within_seconds_and_gives_back_what_it_held(procs, redis_server):
    worker = procs.spawn("worker", [sys.executable, "manage.py", "worker", "--beat", "--queues", "sig-q",
                                    "--concurrency", "2", "--hostname", "sig@%h", "--include", "tests.broker.tasks"])
    wait_for_text(worker, " ready.", 600)
    wait_for_text(worker, "beat: Starting", 600)
    before = set(marked(procs.mark))
    assert len(before) >= 4, before  # the worker, its two pool processes, beat
    code = ("import django; django.setup()\n"
            "from fxpilot.celery import app\n"
            "app.send_task('tests.broker.record', args=('long', 900), queue='sig-q')\n"
            "app.send_task('tests.broker.record', args=('later',), queue='sig-q', countdown=120)\n")
    assert procs.spawn("send", [sys.executable, "-c", code], DJANGO_SETTINGS_MODULE="fxpilot.settings").wait(600) == 0
    client = redis_server.client()
    deadline = time.monotonic() + 600
    while client.hlen("unacked") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.hlen("unacked") == 2 and client.llen("sig-q") == 0  # both taken: one running, one waiting

    os.kill(worker.pid, signal.SIGTERM)
    started = time.monotonic()
    worker.wait(600)
    stopped_after = time.monotonic() - started
    # not after the task's 900 s: a bound only a worker that waited for its task reaches, however loaded the machine
    assert stopped_after < 600, f"the worker waited for its task: stopped after {stopped_after:.1f} s"
    deadline = time.monotonic() + 600
    while marked(procs.mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not marked(procs.mark), "left behind: " + ", ".join(
        open(f"/proc/{pid}/cmdline").read().replace("\0", " ") for pid in marked(procs.mark))
    # The long task was stopped and the waiting one not run: both are back on the queue, none lost.
    assert client.llen("sig-q") + client.hlen("unacked") == 2 and client.llen("sig-q") >= 1
    assert procs.deliveries() == {}
