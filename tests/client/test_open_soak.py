"""The open-loop soak (issue 45): arrivals on a seeded schedule at --rate, sends that never wait for answers,
latency measurable from the schedule, lateness per window, and schedule_kept false when the client fell behind."""
from __future__ import annotations

import random
from itertools import pairwise

import pytest

from tests.client.conftest import read_jsonl, run_client, summaries

LOAD = ["--arm", "fx", "-c", "2", "--prompt-tokens", "32", "--turn-tokens", "4", "--output-tokens", "4",
        "--sessions", "4"]


def _poisson(seed: int, rate: float, horizon: float) -> list[float]:
    """The scheduled offsets the client draws: exponential gaps from random.Random(f"{seed}:soak-arrivals")."""
    rng, t, out = random.Random(f"{seed}:soak-arrivals"), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= horizon:
            return out
        out.append(t)


def _offsets(records: list[dict]) -> list[float]:
    """Scheduled times relative to the first arrival's."""
    times = sorted(r["t_scheduled"] for r in records)
    return [t - times[0] for t in times]


def test_the_open_loop_soak_sends_on_its_seeded_poisson_schedule(server_url, tmp_path):
    out = tmp_path / "soak.jsonl"
    result = run_client("soak", "--url", server_url, "--out", str(out), *LOAD, "--duration-s", "0.6",
                        "--windows", "3", "--rate", "40", "--seed", "11")
    assert result.returncode == 0, result.stderr
    assert "PHASE soak open loop at 40 requests/s (poisson arrivals)" in result.stdout
    records = read_jsonl(out)
    planned = _poisson(11, 40, 0.6)
    assert len(records) == len(planned)
    assert _offsets(records) == pytest.approx([t - planned[0] for t in planned], abs=2e-6)
    assert all(r["status"] == "ok" and r["send_lateness_s"] >= 0 for r in records)
    # the window is the one of the scheduled time
    start = min(r["t_scheduled"] for r in records) - planned[0]
    for r in records:
        assert r["repetition"] == min(3, int((r["t_scheduled"] - start) // 0.2) + 1)
    windows = {s["repetition"]: s for s in summaries(out)}
    assert sorted(windows) == sorted({r["repetition"] for r in records})
    for w, s in windows.items():
        mine = [r for r in records if r["repetition"] == w]
        assert s["open_loop"] is True and s["rate_per_s"] == 40 and s["arrivals"] == "poisson"
        assert s["lateness_s"]["count"] == len(mine) == s["requests"]
        assert s["lateness_s"]["max"] == pytest.approx(max(r["send_lateness_s"] for r in mine), abs=2e-6)
        assert s["schedule"]["requests"] == len(records) and s["in_flight_cap"] == 64
        assert s["window_seconds"] > 0 and s["phase_metrics"]["before"] is not None
    # the windows' /metrics pairs chain: one's end is the next one's start
    ordered = [windows[w] for w in sorted(windows)]
    for early, late in pairwise(ordered):
        assert early["phase_metrics"]["after"] == late["phase_metrics"]["before"]


def test_sends_never_wait_for_answers(start_server, tmp_path):
    url = start_server()
    out = tmp_path / "soak.jsonl"
    # every request hangs until the client's timeout: a closed loop would send 2; the open loop sends them all
    result = run_client("soak", "--url", url, "--model", "hang", "--out", str(out), *LOAD, "--duration-s", "0.5",
                        "--windows", "2", "--rate", "30", "--seed", "5", "--timeout", "2")
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out)
    assert len(records) == len(_poisson(5, 30, 0.5)) > 2
    assert all(r["status"] == "error" and "timed out" in r["error"] for r in records)
    windows = summaries(out)
    assert max(s["in_flight"]["max"] for s in windows) >= len(records) - max(s["requests"] for s in windows)
    assert {s["schedule_kept"] for s in windows} == {True}


def test_a_client_held_at_its_cap_does_not_keep_the_schedule_and_says_so(start_server, tmp_path):
    url = start_server()
    out = tmp_path / "soak.jsonl"
    # two slots, answers that never come: the third send waits for the first one's 1 s timeout
    result = run_client("soak", "--url", url, "--model", "hang", "--out", str(out), *LOAD, "--duration-s", "0.3",
                        "--windows", "1", "--rate", "50", "--seed", "3", "--timeout", "1", "--max-in-flight", "2",
                        "--max-lateness-s", "0.25")
    assert result.returncode == 0, result.stderr
    [summary] = summaries(out)
    assert summary["schedule_kept"] is False and summary["cap_hits"] >= 1
    assert summary["schedule"]["max_lateness_s"] == 0.25
    assert summary["schedule"]["lateness_p99_s"] > 0.25 and summary["schedule"]["cap_hits"] == summary["cap_hits"]
    assert summary["lateness_s"]["max"] >= 1 - 0.3   # held until a 1 s timeout freed a slot
    assert "SCHEDULE NOT KEPT" in result.stdout


def test_trace_arrivals_keep_the_trace_shape_scaled_to_the_rate(server_url, tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\nx,1,5,1,0\ny,1,5,1,1\n"
                     "z,1,5,1,3\n")
    out = tmp_path / "soak.jsonl"
    result = run_client("soak", "--url", server_url, "--out", str(out), *LOAD, "--duration-s", "0.5",
                        "--windows", "1", "--rate", "15", "--arrivals", "trace", "--trace", str(trace))
    assert result.returncode == 0, result.stderr
    # gaps 1 s and 2 s (mean 1.5 s) scaled to a mean of 1/15 s: 1/22.5 s and 2/22.5 s, cycled; the first arrival
    # is one gap (1/22.5 s) after the start, so the gaps between sends begin with the 2/22.5 s one
    offsets = _offsets(read_jsonl(out))
    gaps = [b - a for a, b in pairwise(offsets)]
    assert len(offsets) == 7  # arrivals at 1, 3, 4, 6, 7, 9, 10 (/22.5 s) before 0.5 s
    assert gaps == pytest.approx([(2 if i % 2 == 0 else 1) / 22.5 for i in range(len(gaps))], abs=2e-6)


def test_a_soak_cannot_be_both_open_and_closed(server_url, tmp_path):
    result = run_client("soak", "--url", server_url, "--out", str(tmp_path / "s.jsonl"), *LOAD, "--duration-s", "1",
                        "--rate", "5", "--closed-loop")
    assert result.returncode == 2 and "--closed-loop and --rate 5 contradict each other" in result.stderr
    result = run_client("soak", "--url", server_url, "--out", str(tmp_path / "s.jsonl"), *LOAD, "--duration-s", "1",
                        "--rate", "5", "--arrivals", "trace")
    assert result.returncode == 2 and "soak --arrivals trace needs --trace FILE.csv" in result.stderr


def test_an_open_soak_short_of_its_floor_keeps_its_rate_into_its_last_window(start_server, tmp_path):
    url = start_server()
    out = tmp_path / "soak.jsonl"
    result = run_client("soak", "--url", url, "--model", "http-500", "--out", str(out), *LOAD, "--duration-s", "0.4",
                        "--windows", "2", "--rate", "30", "--seed", "9", "--min-requests", "1000")
    assert result.returncode == 0, result.stderr
    assert "PHASE soak extended: 0 error-free requests of the 1000" in result.stdout
    records = read_jsonl(out)
    within, twice = len(_poisson(9, 30, 0.4)), len(_poisson(9, 30, 0.8))
    assert within < len(records) <= twice
    late = sorted(records, key=lambda r: r["t_scheduled"])[within:]
    assert {r["repetition"] for r in late} == {2}
    assert {s["extended_with_ok"] for s in summaries(out)} == {0}


def test_the_soak_pool_is_sized_above_hbm_and_lmcache_dram():
    from runners.remote import workload
    assert workload.soak_pool(16, 65536, None) == 32
    assert workload.soak_pool(16, 65536, 6_350_000) == 122          # 1.25 × 6.35 M ÷ 64 Ki, rounded up
    assert workload.soak_pool(16, 65536, 6_350_000, 10_000_000) == 312   # 1.25 × 16.35 M ÷ 64 Ki
    assert workload.soak_pool(16, 65536, None, 10_000_000) == 191


def test_the_closed_loop_soak_says_so_and_counts_dram_in_its_pool(server_url, tmp_path):
    out = tmp_path / "soak.jsonl"
    result = run_client("soak", "--url", server_url, "--out", str(out), "--arm", "fx", "-c", "2", "--prompt-tokens",
                        "32", "--output-tokens", "2", "--duration-s", "0.2", "--windows", "1", "--closed-loop",
                        "--dram-tokens", "320")
    assert result.returncode == 0, result.stderr
    [summary] = summaries(out)
    # the stream server reports no HBM capacity: the pool is above DRAM alone, 1.25 × 320 ÷ 32 = 13 sessions
    assert summary["open_loop"] is False and summary["dram_tokens"] == 320 and summary["soak_sessions"] == 13
