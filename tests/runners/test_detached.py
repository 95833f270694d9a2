"""Detached long commands on a simulated node: start, poll with offsets, re-attach, exit codes, cancel."""
from __future__ import annotations

import time

import pytest

from runners import detached, ssh
from tests.runners.conftest import job_text, set_faults


def _wait(node, proc, until: str, timeout: float = 600) -> detached.PollResult:
    deadline = time.monotonic() + timeout
    while True:
        status = detached.poll(node, proc)
        if status.state == until or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def test_a_detached_command_reports_its_exit_code_and_its_log_in_pieces(simnodes, make_node, job):
    server = simnodes(1)[0]
    node = make_node(server)
    proc = detached.start(node, "~/runs/r1", "echo one; until [ -f go ]; do sleep 0.05; done; echo two; echo problem >&2; exit 5")
    assert proc.pgid > 1 and proc.dir.endswith("/runs/r1")
    first = ""
    deadline = time.monotonic() + 600
    while first != "one\n" and time.monotonic() < deadline:
        status = detached.poll(node, proc, job=job)
        first += status.stdout
        assert status.running
    assert first == "one\n" and proc.stdout_offset == 4
    (server.root / "runs" / "r1" / "go").touch()
    last = _wait(node, proc.to_dict(), "exited")
    assert last.state == "exited" and last.exit_code == 5 and not last.running
    assert last.stdout == "two\n" and last.stderr == "problem\n" and last.proc.stdout_offset == 8
    assert job_text(job, "stdout") == "one\n"


def test_polling_again_after_the_connection_dropped_re_attaches(simnodes, make_node):
    server = simnodes(1)[0]
    node = make_node(server)
    proc = detached.start(node, "~/runs/long", "for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.2; done")
    set_faults(server, drop_ssh_after_seconds=0.2)
    with pytest.raises(ssh.ConnectionLost):
        ssh.run(node, "sleep 5")
    set_faults(server, drop_ssh_after_seconds=None)
    stored = proc.to_dict()
    status = _wait(node, stored, "exited")
    assert status.exit_code == 0 and status.stdout.splitlines()[-1] == "tick 6"


def test_starting_twice_in_one_run_directory_is_refused_while_running(simnodes, make_node):
    node = make_node(simnodes(1)[0])
    proc = detached.start(node, "~/runs/busy", "sleep 30")
    with pytest.raises(ssh.CommandFailed, match="already holds the running process group"):
        detached.start(node, "~/runs/busy", "sleep 30")
    detached.cancel(node, proc, grace_seconds=1)


def test_cancel_kills_the_whole_process_group_and_leaves_nothing(simnodes, make_node, job):
    node = make_node(simnodes(1)[0])
    with ssh.connect(node) as conn:
        proc = detached.start(conn, "sleep 300 & (sleep 300; true) & trap '' TERM; sleep 300", name="stubborn", job=job)
        assert detached.poll(conn, proc).running
        result = detached.cancel(conn, proc, grace_seconds=0.5, job=job)
        assert result.signalled and result.left == []
        left = conn.run(f"ps -eo pgid=,stat= | awk '$1 == {proc.pgid} && $2 !~ /^Z/' | wc -l").stdout.strip()
    assert left == "0"
    assert detached.poll(node, proc).state == "canceled"
    assert detached.cancel(node, proc).signalled is False


def test_a_stored_record_that_is_not_a_process_is_refused(simnodes, make_node):
    node = make_node(simnodes(1)[0])
    with pytest.raises(ValueError, match="refusing process group 1"):
        detached.cancel(node, {"dir": "~/x", "pid": 1, "pgid": 1})
    with pytest.raises(ValueError, match="not a detached process record"):
        detached.poll(node, {"dir": "~/x"})


def test_an_ended_process_is_finished_only_once_every_byte_it_logged_was_read(simnodes, make_node):
    node = make_node(simnodes(1)[0])
    # 3,000 lines of 13 bytes, then the end: five polls of 8 KiB carry them
    proc = detached.start(node, "~/runs/chatty", "for i in $(seq 1000 3999); do echo PROGRESS$i; done; exit 3")
    _wait(node, proc.to_dict(), "exited")
    seen, looks = "", 0
    while True:
        status = detached.poll(node, proc, max_bytes=8192)
        seen, looks = seen + status.stdout, looks + 1
        assert status.state == "exited" and status.exit_code == 3
        if status.finished:
            break
        assert status.more and not status.running
    assert looks == -(-3000 * 13 // 8192) and seen.splitlines() == [f"PROGRESS{i}" for i in range(1000, 4000)]
