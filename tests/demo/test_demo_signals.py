"""The demo's process edges, with real processes: a worker killed with SIGKILL mid-gate is restarted and
the run completes (every record once) — in the whole-pilot demo, which is then killed outright and must
leave nothing behind (tests/demo/test_demo_pipeline.py); closing the terminal (SIGHUP) mid-gate cancels
the run and stops everything the demo started. The demos run once, together (tests/demo/conftest.py)."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest

# the demos take minutes, longer on a loaded machine: more than the suite's 1,200 s per test while a test waits for one
pytestmark = [pytest.mark.slow, pytest.mark.timeout(4000)]


def _records(demo, job_id: int) -> list[dict]:
    rows = []
    for (sha,) in demo.query(f"SELECT sha256 FROM runners_artifact WHERE job_id = {job_id} AND kind = 'records'"):
        path = demo.data / "artifacts" / sha[:2] / sha
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def test_a_worker_killed_mid_gate_is_restarted_and_the_run_completes_with_every_record_once(demos):
    started, scenarios = demos
    demo = started["nominal"]
    scenarios["nominal"].fact("g1_ended", 1800)  # G1 only: the rest of the pilot is checked elsewhere
    seq, name = scenarios["nominal"].fact("g1_step_killed", 600)  # the workload step running when the worker died
    assert "G1 run ended successful" in demo.text(), demo.text()[-4000:]
    (job_id, status), = demo.query("SELECT j.id, j.status FROM runners_job j JOIN gates_gate g ON j.gate_id = g.id "
                                   "WHERE g.number = 1")
    assert status == "successful"
    rows = _records(demo, job_id)
    keys = [(r["instance"], r["arm"], r["phase"], r["concurrency"], r["repetition"], r["session"]) for r in rows]
    assert rows and len(set(keys)) == len(keys), Counter(keys).most_common(3)
    # Every step ended successful; the one the kill caught was claimed again (attempt 2), none more often.
    steps = demo.query(f"SELECT status, attempts FROM runners_step WHERE job_id = {job_id}")
    assert {status for status, _ in steps} == {"successful"} and max(a for _, a in steps) <= 2, steps
    assert demo.query(f"SELECT name FROM runners_step WHERE job_id = {job_id} AND seq = {seq}") == [(name,)]


def test_closing_the_demos_terminal_mid_gate_stops_everything_it_started(demos):
    started, scenarios = demos
    demo = started["hangup"]
    facts = scenarios["hangup"].result(900)
    assert set(facts["services"]) == {"broker", "simulated nodes", "worker", "portal"}
    assert "Stopping what the demo started (SIGHUP)" in demo.text()
    # every process stopped on SIGTERM, none had to be killed: the broker stops after what says goodbye through it
    # (a worker whose broker had gone first retried its last heartbeat until it was killed) and the site agent is
    # asked twice (it would wait for its long poll)
    assert re.search(r"^What the demo started stopped in \d+:\d\d\.$", demo.text(), re.MULTILINE), demo.text()[-2000:]
    assert facts["left_behind"] == []
    (status,), = demo.query("SELECT status FROM runners_job")
    assert status == "canceled"  # the run going was canceled through the worker before it stopped
    # the hangup came while a workload step ran: no step is left running or waiting; the judging steps after the
    # teardowns (G1's evaluate and report) never ran
    rows = demo.query("SELECT seq, name, status FROM runners_step")
    steps = {seq: status for seq, _, status in rows}
    assert facts["g1_step"][0] in steps and not {"running", "pending"} & set(steps.values()), rows
    judging = [status for _, name, status in rows if name in ("evaluate", "report")]
    assert "canceled" in steps.values() and judging and "successful" not in judging, rows
