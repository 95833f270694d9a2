"""The cold-recovery command end to end against a real streaming server: progress lines, records the
judge accepts, one summary per phase, eviction and the coldness check."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gates.judge.records import PHASE_FIELDS, REQUEST_FIELDS, REQUEST_OPTIONAL, check_fields, load_inputs
from tests.client.conftest import CLIENT, read_jsonl, run_client, summaries

SMALL = ["--prompt-tokens", "256", "--turn-tokens", "16", "--output-tokens", "8", "-c", "2,4", "--repetitions", "2",
         "--requests-per-client", "2", "--evict", "reset", "--run-id", "g3-run"]


def test_cold_recovery_runs_every_cell_and_the_judge_reads_its_records(server_url, tmp_path):
    out = tmp_path / "records" / "fx.jsonl"
    result = run_client("cold-recovery", "--url", server_url, "--arm", "fx", "--out", str(out), *SMALL)
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out)
    # every repetition its own 8 fresh sessions (max level × 2) populated, then (2×2 + 4×2) measure requests
    assert len(records) == 2 * 8 + 2 * (4 + 8)
    assert all(r["status"] == "ok" for r in records)
    for r in records:
        check_fields(r, REQUEST_FIELDS, str(out), None)
        check_fields(r, REQUEST_OPTIONAL, str(out), None, required=False)
        assert r["t_send"] <= r["t_first_token"] <= r["t_end"]
    cells = {(r["phase"], r["concurrency"], r["repetition"]) for r in records}
    assert cells == {("populate", 4, 1), ("populate", 4, 2)} | {("measure", c, rep) for c in (2, 4) for rep in (1, 2)}
    # the session is the unit of a hit ratio: no session returns in two repetitions (judge version 3)
    measured = {rep: {r["session"] for r in records if r["phase"] == "measure" and r["repetition"] == rep}
                for rep in (1, 2)}
    assert measured[1] and measured[2] and not measured[1] & measured[2]
    lines = result.stdout.splitlines()
    assert "PROGRESS 40/40 ok=40" in lines  # ended / planned, and how many of them error-free
    assert any(line.startswith("EVICT prefix cache reset") for line in lines)
    phases = summaries(out)
    assert [(s["phase"], s["concurrency"], s["repetition"]) for s in phases] == [
        ("populate", 4, 1), ("measure", 2, 1), ("measure", 4, 1), ("populate", 4, 2), ("measure", 2, 2),
        ("measure", 4, 2)]
    for s in phases:
        check_fields(s, PHASE_FIELDS, "summary", None)
        assert s["max_in_flight"] == s["concurrency"]
        assert s["client_cpu_s"] > 0 and s["requests"] > 0
        assert s["metrics_after"]["vllm:prompt_tokens_total"] > s["metrics_before"]["vllm:prompt_tokens_total"]
    assert phases[1]["coldness"]["cold"] is True and phases[1]["eviction"] == {"reset": "prefix cache reset"}
    inputs = load_inputs([str(out), str(out.with_name("fx.summary.json"))])
    assert len(inputs.requests) == 40 and len(inputs.summaries) == 6


def test_a_session_returns_with_its_populated_context_and_a_new_turn(server_url, tmp_path):
    out = tmp_path / "fx.jsonl"
    assert run_client("cold-recovery", "--url", server_url, "--arm", "fx", "--out", str(out), *SMALL).returncode == 0
    by_phase = {}
    for r in read_jsonl(out):
        by_phase.setdefault(r["phase"], {})[r["session"]] = r["prompt_tokens"]
    assert set(by_phase["measure"]) <= set(by_phase["populate"])
    assert all(tokens == 256 + 16 for tokens in by_phase["measure"].values())


def test_a_cache_still_hot_in_hbm_is_reported(server_url, tmp_path):
    out = tmp_path / "fx.jsonl"
    result = run_client("measure", "--url", server_url, "--arm", "fx", "--model", "cached", "--out", str(out), *SMALL)
    assert result.returncode == 0, result.stderr
    assert "NOT COLD: GPU prefix cache served 100.0% of" in result.stdout
    cold = summaries(out)[0]["coldness"]
    assert cold["cold"] is False and "still hot in HBM" in cold["detail"]
    assert all(r["cached_tokens"] == r["prompt_tokens"] for r in read_jsonl(out))


def test_records_written_before_a_kill_are_complete_lines(start_server, tmp_path):
    url = start_server("--hang-after", "3")
    out = tmp_path / "fx.jsonl"
    proc = subprocess.Popen([sys.executable, str(CLIENT), "populate", "--url", url, "--arm", "fx", "--out", str(out),
                             "--sessions", "6", "--prompt-tokens", "32", "-c", "1"], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 3):
        time.sleep(0.05)
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    text = out.read_text()
    assert text.endswith("\n")
    assert [json.loads(line)["status"] for line in text.splitlines()] == ["ok", "ok", "ok"]


def test_an_eviction_the_server_refuses_stops_the_run_with_the_reason(tmp_path):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class NoDevMode(BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NoDevMode)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = run_client("evict", "--url", f"http://127.0.0.1:{server.server_port}", "--arm", "fx",
                            "--out", str(tmp_path / "x.jsonl"), "--evict", "reset")
    finally:
        server.shutdown()
    assert result.returncode == 3
    assert "answered HTTP 404 (the server needs VLLM_SERVER_DEV_MODE=1)" in result.stderr


@pytest.mark.parametrize("before, after, cold", [
    ({"vllm:prompt_tokens_total": 0, "vllm:prefix_cache_hits_total": 0}, {"vllm:prompt_tokens_total": 1000,
     "vllm:prefix_cache_hits_total": 10, "vllm:external_prefix_cache_hits_total": 950}, True),
    ({"vllm:prompt_tokens_total": 0, "vllm:prefix_cache_hits_total": 0}, {"vllm:prompt_tokens_total": 1000,
     "vllm:prefix_cache_hits_total": 900}, False),
    # a restart reset the counters: they count from zero
    ({"vllm:prompt_tokens_total": 5000, "vllm:prefix_cache_hits_total": 4000}, {"vllm:prompt_tokens_total": 1000,
     "vllm:prefix_cache_hits_total": 0}, True),
    ({}, {"vllm:prompt_tokens_total": 1000}, None),
])
def test_coldness_comes_from_counter_deltas(before, after, cold):
    from runners.remote.workload import coldness
    assert coldness(before, after)["cold"] is cold


def test_metrics_are_summed_over_identity_labels_and_keep_the_others():
    from runners.remote.workload import parse_metrics
    text = """# HELP vllm:prefix_cache_hits_total hits
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 5.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 7
lmcache:num_hit_tokens_total 3
vllm:time_to_first_token_seconds_bucket{le="0.1"} 2
"""
    assert parse_metrics(text) == {"vllm:prefix_cache_hits_total": 15.0, "lmcache:num_hit_tokens_total": 3.0,
                                   'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}': 7.0}


def test_sigterm_records_what_finished_and_exits_143(start_server, tmp_path):
    url = start_server("--hang-after", "4")
    out = tmp_path / "fx.jsonl"
    proc = subprocess.Popen([sys.executable, str(CLIENT), "populate", "--url", url, "--arm", "fx", "--out", str(out),
                             "--sessions", "8", "--prompt-tokens", "32", "-c", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 4):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 143, stderr
    assert "terminated by SIGTERM" in stderr
    assert [json.loads(line)["status"] for line in out.read_text().splitlines()] == ["ok"] * 4


def test_eviction_by_restart_runs_the_hook_and_waits_for_health(server_url, tmp_path):
    marker = tmp_path / "restarted"
    result = run_client("evict", "--url", server_url, "--arm", "fx", "--out", str(tmp_path / "none.jsonl"),
                        "--evict", "restart,reset", "--restart-cmd", f"touch {marker}", "--health-timeout", "10")
    assert result.returncode == 0, result.stderr
    assert marker.exists()
    printed = next(line for line in result.stdout.splitlines() if line.startswith("{"))
    assert json.loads(printed)["eviction"] == {"restart": "server restarted and healthy",
                                                                       "reset": "prefix cache reset"}


def test_a_failing_restart_hook_stops_the_run_with_its_output(server_url, tmp_path):
    result = run_client("evict", "--url", server_url, "--arm", "fx", "--out", str(tmp_path / "none.jsonl"),
                        "--evict", "restart", "--restart-cmd", "echo no such service >&2; exit 5")
    assert result.returncode == 3
    assert "--restart-cmd exited 5: no such service" in result.stderr


def test_without_metrics_the_client_says_unverified_never_cold(start_server, tmp_path):
    out = tmp_path / "fx.jsonl"
    url = start_server("--no-metrics")
    result = run_client("measure", "--url", url, "--arm", "fx", "--out", str(out), *SMALL)
    assert result.returncode == 0, result.stderr
    verdicts = [line for line in result.stdout.splitlines() if "COLD: " in line or line.startswith("UNVERIFIED: ")]
    assert verdicts and all(line.startswith("UNVERIFIED: ") for line in verdicts), verdicts
    assert all(s["coldness"]["cold"] is None and "no /metrics" in s["coldness"]["detail"]
               for s in summaries(out) if s["phase"] == "measure")


@pytest.mark.parametrize("flag", ["no", "auto"])
def test_a_server_that_says_it_is_the_simulator_makes_the_records_simulated_whatever_the_flag(start_server, tmp_path,
                                                                                              flag):
    out = tmp_path / "fx.jsonl"
    url = start_server("--simulated")
    result = run_client("populate", "--url", url, "--arm", "fx", "--out", str(out), "--simulated", flag, *SMALL)
    assert result.returncode == 0, result.stderr
    assert read_jsonl(out) and all(r["simulated"] is True for r in read_jsonl(out))
    assert all(s["simulated"] is True for s in summaries(out))
