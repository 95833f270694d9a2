"""The README's run command, end to end, as a new user gets it: the embedded default (SQLite, the
embedded Redis broker, simulated nodes on loopback), a whole pilot, five signed reports that verify,
a procurement report whose unit count says what it rests on; and the degraded-FX scenario, which
halts at G3. The demos run once, together (tests/demo/conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the demos take minutes, longer on a loaded machine: more than the suite's 600 s per test while a test waits for one
pytestmark = [pytest.mark.slow, pytest.mark.timeout(4000)]


def _verify(path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["FXPILOT_DATA_DIR"] = str(path.parents[2])
    return subprocess.run([sys.executable, "manage.py", "verify_report", str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _text(path: Path) -> str:
    return " ".join(subprocess.run(["pdftotext", str(path), "-"], capture_output=True, text=True, check=True).stdout.split())


@pytest.fixture(scope="module")
def nominal(demos):
    started, scenarios = demos
    facts = scenarios["nominal"].result(3900)
    return started["nominal"], facts


def test_the_demo_runs_a_whole_pilot_and_leaves_five_signed_reports(nominal):
    demo, facts = nominal
    out = demo.text()
    assert "SIMULATION" in out and "The portal stays up until Ctrl-C." in out, out[-3000:]
    assert demo.query("SELECT state FROM gates_pilot WHERE state != 'draft'") == [("completed",)]
    gates = demo.query("SELECT g.number, g.state FROM gates_gate g JOIN gates_pilot p ON g.pilot_id = p.id "
                       "WHERE p.state = 'completed' ORDER BY g.number")
    assert gates == [(1, "signed_off"), (2, "signed_off"), (3, "signed_off"), (4, "signed_off")]
    reports = demo.query("SELECT kind, path FROM gates_report ORDER BY created")
    kinds = [kind for kind, _ in reports]
    assert kinds.count("procurement") == 1 and kinds.count("gate") >= 4
    for _, path in reports:
        checked = _verify(demo.data / path)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    assert out.count("verified") >= 5 and "NOT VERIFIED" not in out
    # the portal served on the port the kernel picked (--port 0)
    assert facts["portal"].startswith("http://127.0.0.1:") and not facts["portal"].endswith(":0/")
    assert facts["portal_status"] == 200


def test_the_procurement_report_gives_a_unit_count_resting_on_an_assumed_example_figure(nominal):
    demo, _ = nominal
    assert "an example figure for the demo, not a published one" in demo.text()
    (path,), = demo.query("SELECT path FROM gates_report WHERE kind = 'procurement'")
    text = _text(demo.data / path)
    assert "FX100 unit(s) of 60.0 TB usable each" in text, text[:3000]
    assert "This unit count rests on an assumed example figure for the demo" in text
    assert "an assumed example figure for the demo, not a published one" in text
    assert "The number of FX100 units cannot be given" not in text


def test_a_demo_killed_outright_after_a_worker_restart_leaves_nothing_behind(nominal):
    _, facts = nominal
    assert facts["processes"] >= 6  # broker, simulated nodes, worker and its pool, beat, portal
    assert facts["left_behind"] == []


def test_the_degraded_fx_scenario_halts_the_pilot_at_g3(demos):
    started, _ = demos
    demo = started["degraded"]
    code = demo.wait(1800)
    assert code == 0, demo.text()[-3000:]
    pilot = demo.query("SELECT id, state, halted_reason FROM gates_pilot WHERE state != 'draft'")
    assert len(pilot) == 1 and pilot[0][1] == "halted" and pilot[0][2].startswith("G3 failed")
    gates = dict(demo.query(f"SELECT number, state FROM gates_gate WHERE pilot_id = {pilot[0][0]}"))
    assert gates == {1: "signed_off", 2: "signed_off", 3: "failed", 4: "pending"}
    assert demo.query(f"SELECT COUNT(*) FROM runners_job j JOIN gates_gate g ON j.gate_id = g.id "
                      f"WHERE g.pilot_id = {pilot[0][0]} AND g.number = 4") == [(0,)]
    g3_report = demo.query(f"SELECT r.path FROM gates_report r JOIN gates_gate g ON r.gate_id = g.id "
                           f"WHERE g.pilot_id = {pilot[0][0]} AND g.number = 3")
    assert g3_report, "the failed gate has its report"
    checked = _verify(demo.data / g3_report[0][0])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    text = _text(demo.data / g3_report[0][0])
    assert "g3-ttft-vs-local" in text or "FAIL" in text.upper()
    assert demo.left_behind(30) == []
