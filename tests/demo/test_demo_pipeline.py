"""The README's run command, end to end, as a new user gets it: the embedded default (SQLite, the
embedded Redis broker, simulated nodes on loopback), a whole pilot, five signed reports that verify;
and the degraded-FX scenario, which halts at G3."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow]


def _demo(tmp_path: Path, *args: str, timeout: int) -> tuple[subprocess.CompletedProcess, Path]:
    data = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "FXPILOT_ENV")}
    env["FXPILOT_DATA_DIR"] = str(data)
    result = subprocess.run([sys.executable, "manage.py", "demo", "--no-serve", "--port", "8300", *args], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=timeout)
    return result, data


def _query(data: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(data / "fxpilot.sqlite3") as db:
        return db.execute(sql).fetchall()


def _verify(path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["FXPILOT_DATA_DIR"] = str(path.parents[2])
    return subprocess.run([sys.executable, "manage.py", "verify_report", str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_demo_runs_a_whole_pilot_and_leaves_five_signed_reports(tmp_path):
    result, data = _demo(tmp_path, timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "SIMULATION" in result.stdout
    assert _query(data, "SELECT state FROM gates_pilot WHERE state != 'draft'") == [("completed",)]
    gates = _query(data, "SELECT g.number, g.state FROM gates_gate g JOIN gates_pilot p ON g.pilot_id = p.id "
                         "WHERE p.state = 'completed' ORDER BY g.number")
    assert gates == [(1, "signed_off"), (2, "signed_off"), (3, "signed_off"), (4, "signed_off")]
    reports = _query(data, "SELECT kind, path FROM gates_report ORDER BY created")
    kinds = [kind for kind, _ in reports]
    assert kinds.count("procurement") == 1 and kinds.count("gate") >= 4
    for _, path in reports:
        checked = _verify(data / path)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    assert result.stdout.count("verified") >= 5 and "NOT VERIFIED" not in result.stdout


def test_the_degraded_fx_scenario_halts_the_pilot_at_g3(tmp_path):
    result, data = _demo(tmp_path, "--scenario", "degraded-fx", timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    pilot = _query(data, "SELECT id, state, halted_reason FROM gates_pilot WHERE state != 'draft'")
    assert len(pilot) == 1 and pilot[0][1] == "halted" and pilot[0][2].startswith("G3 failed")
    gates = dict(_query(data, f"SELECT number, state FROM gates_gate WHERE pilot_id = {pilot[0][0]}"))
    assert gates == {1: "signed_off", 2: "signed_off", 3: "failed", 4: "pending"}
    assert _query(data, f"SELECT COUNT(*) FROM runners_job j JOIN gates_gate g ON j.gate_id = g.id "
                        f"WHERE g.pilot_id = {pilot[0][0]} AND g.number = 4") == [(0,)]
    g3_report = _query(data, f"SELECT r.path FROM gates_report r JOIN gates_gate g ON r.gate_id = g.id "
                             f"WHERE g.pilot_id = {pilot[0][0]} AND g.number = 3")
    assert g3_report, "the failed gate has its report"
    checked = _verify(data / g3_report[0][0])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    text = subprocess.run(["pdftotext", str(data / g3_report[0][0]), "-"], capture_output=True, text=True).stdout
    assert "g3-ttft-vs-local" in text or "FAIL" in text.upper()
