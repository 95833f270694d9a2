"""What the demo prints while a gate runs: the progress of a timed phase by its time, one live line per gate on a
terminal, a plain line at most every 10 s otherwise; and the soak's request rate and length from what was measured."""
from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.management import demo_soak
from portal.management.demo_progress import PLAIN_EVERY, ProgressView, clock, gate_line
from runners.models import Job, Site, Status, Step
from runners.progress import job_progress

SOAK = {"seq": 7, "name": "soak", "arm": "fx", "node": "node2", "requests_done": 2128, "requests_total": 2128,
        "seconds_elapsed": 65.2, "seconds_planned": 180.0}
MEASURE = {"seq": 12, "name": "replay", "arm": "recompute", "node": "node1", "requests_done": 45, "requests_total": 288,
           "seconds_elapsed": 30.0, "seconds_planned": None}


def _progress(*current, step=7, total=16, elapsed=130.0, eta=160.0) -> dict:
    return {"step": step, "steps_total": total, "current": list(current), "elapsed_seconds": elapsed, "eta_seconds": eta}


def test_a_timed_phase_shows_its_time_and_the_requests_it_sent_not_a_growing_total():
    line = gate_line("G4", _progress(SOAK, MEASURE))
    assert line == ("G4: step 7/16 · soak fx@node2 1:05 of 3:00 (2,128 requests), replay recompute@node1 requests "
                    "45/288 · 2:10 elapsed, about 2:40 left")
    assert "2,128/2,128" not in line and "2128/2128" not in line


def test_a_timed_phase_running_over_its_plan_shows_the_plan_and_durations_read_as_clocks():
    assert "soak fx@node2 3:00 of 3:00" in gate_line("G4", _progress({**SOAK, "seconds_elapsed": 190.0}))
    # a soak past its length, short of its floor, says what it sends on to
    over = gate_line("G4", _progress({**SOAK, "seconds_elapsed": 190.0, "requests_floor": 3911, "requests_done": 3500}))
    assert "soak fx@node2 3:00 done, on to 3,911 error-free requests (3,500 so far)" in over
    # the floor counts error-free requests: 4,000 ended, 3,800 of them error-free, is still short of it
    failing = gate_line("G4", _progress({**SOAK, "seconds_elapsed": 190.0, "requests_floor": 3911, "requests_done": 4000,
                                         "requests_ok": 3800}))
    assert "on to 3,911 error-free requests (3,800 so far)" in failing
    # a soak that has its count and is only ending (its last requests, its summary) says no more than its time
    ending = gate_line("G4", _progress({**SOAK, "seconds_elapsed": 190.0, "requests_floor": 3911, "requests_done": 4224}))
    assert "soak fx@node2 3:00 of 3:00 (4,224 requests)" in ending
    assert [clock(s) for s in (0, 7.4, 65, 3599.6, 3725)] == ["0:00", "0:07", "1:05", "1:00:00", "1:02:05"]
    assert gate_line("G1", _progress(elapsed=None, eta=None, step=1, total=10)) == "G1: step 1/10"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_without_a_terminal_a_gate_prints_a_plain_line_at_most_every_ten_seconds():
    out, now = io.StringIO(), Clock()
    view = ProgressView(out, terminal=False, now=now)
    assert not view.terminal
    view.say("G4 Production fit: run 1234abcd started …")
    view.start("G4")
    for second in range(0, 36):
        now.now = float(second)
        view.update(_progress(SOAK, elapsed=float(second)))
    view.end("G4 run ended successful in 0:36")
    lines = out.getvalue().splitlines()
    progress = [line for line in lines if line.startswith("  G4: step")]
    assert len(progress) == 3 and "\x1b" not in out.getvalue()  # at 10, 20 and 30 s: no control codes
    assert [float(line.split(" · ")[-1].split()[0].replace(":", ".")) for line in progress] == [0.10, 0.20, 0.30]
    assert lines[0].startswith("G4 Production fit") and lines[-1] == "G4 run ended successful in 0:36"
    assert PLAIN_EVERY == 10.0


def test_on_a_terminal_a_gate_has_one_live_line_that_its_ending_replaces():
    out = io.StringIO()
    view = ProgressView(out, terminal=True)
    assert view.terminal
    view.start("G1")
    for done in range(1, 30):
        view.update(_progress({**MEASURE, "requests_done": done}, step=6, total=10))
    view.say("  ! the worker process stopped (exit -9); starting it again")
    view.end("G1 run ended successful in 1:01")
    text = out.getvalue()
    assert "G1: step 6/10 · replay recompute@node1 requests 29/288" in text
    assert "\r\x1b[2K" in text  # the line is redrawn in place, not printed again below
    assert text.count("\n") <= 4  # the message, the ending, and the live region's own line breaks
    assert text.rstrip().endswith("G1 run ended successful in 1:01")
    assert view.live is None


@pytest.mark.django_db
def test_job_progress_counts_a_running_soak_by_its_time(signed_pilot):
    site = Site.objects.create(pilot=signed_pilot.pilot, name="lab-progress", queue="site-lab-progress")
    node = site.nodes.create(name="node2", host="127.0.0.1", port=22, username="fxpilot")
    job = Job.objects.create(pilot=signed_pilot.pilot, gate=signed_pilot.pilot.gate(1), site=site)
    started = timezone.now() - timedelta(seconds=100)
    Job.objects.filter(pk=job.pk).update(status=Status.RUNNING, started=started)
    Step.objects.create(job=job, seq=1, name="deploy", node=node, arm="fx", status=Status.SUCCESSFUL)
    Step.objects.create(job=job, seq=2, name="soak", node=node, arm="fx", status=Status.RUNNING,
                        started=timezone.now() - timedelta(seconds=60), params={"seconds": 240.0, "min_requests": 3911},
                        requests_done=900, requests_total=900, remote={"requests_ok": 880})
    Step.objects.create(job=job, seq=3, name="collect", node=node, arm="fx")
    job.refresh_from_db()
    progress = job_progress(job)
    soak = progress["current"][0]
    assert soak["seconds_planned"] == 240.0 and 59 <= soak["seconds_elapsed"] <= 70 and soak["requests_floor"] == 3911
    assert soak["requests_ok"] == 880  # what the floor counts: the error-free ones, as the client last said
    # a quarter of the soak, not "900 of 900 requests": 1.25 of 3 steps
    assert 0.40 <= progress["fraction"] <= 0.45
    # the run cannot end before the soak does: at least its 3 minutes left
    assert progress["eta_seconds"] >= 170
    assert progress["requests_done"] == 900  # the existing figures keep their meaning


def test_a_progress_line_gives_the_requests_ended_planned_and_error_free_and_an_older_client_no_count():
    from runners.steps import _progress

    assert _progress("PHASE soak\nPROGRESS 10/40 ok=9\nsome output\nPROGRESS 25/40 ok=21\n") == (25, 40, 21)
    assert _progress("PROGRESS 25/40\n") == (25, 40, None)  # a client of an earlier run, adopted
    assert _progress("PROGRESS 25/40 ok=x\nno progress here\n") == (25, 40, None)
    assert _progress("") == (None, None, None)


def _row(turn: int, sent: float, end: float, status: str = "ok") -> dict:
    return {"turn": turn, "t_send": sent, "t_end_wall": end, "status": status}


def test_the_soak_rate_is_counted_after_every_session_was_sent_once():
    warm = [_row(1, 0.0, 4.0), _row(1, 0.0, 6.0)]
    assert demo_soak.steady_rate(warm, sessions=2) is None
    steady = [_row(2, 6.0 + i * 0.1, 6.2 + i * 0.1) for i in range(40)] + [_row(2, 7.0, 8.0, "error")]
    rate, count, seconds, warmup = demo_soak.steady_rate(warm + steady, sessions=2)
    assert (count, warmup) == (40, 6.0) and seconds == pytest.approx(4.1)
    assert rate == pytest.approx(40 / 4.1)
    # a session not yet answered once: no steady part yet
    assert demo_soak.steady_rate(warm[:1] + steady, sessions=2) is None


def test_the_soak_is_sized_for_the_planners_count_with_margin_and_the_warm_up():
    rate = demo_soak.SoakRate(per_second=40.0, requests=320, seconds=8.0, warmup_seconds=5.0)
    seconds = demo_soak.soak_seconds(3911, rate)
    assert seconds == pytest.approx(3911 * demo_soak.SOAK_MARGIN / 40 + 2 * 5.0, abs=1)
    assert demo_soak.soak_seconds(10, rate) == demo_soak.MIN_SOAK_SECONDS
    slow = demo_soak.SoakRate(per_second=8.0, requests=64, seconds=8.0, warmup_seconds=5.0)
    assert demo_soak.soak_seconds(3911, slow) > 4 * seconds
