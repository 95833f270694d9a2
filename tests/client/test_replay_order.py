"""G4 replay (issue 44): every repetition starts cold (a salt per repetition in the content address), the capped
replay sends strictly in the trace's order from one queue, and in-flight concurrency is measured, not the cap."""
from __future__ import annotations

import argparse
import time
from itertools import pairwise

from runners.remote import workload
from tests.client.conftest import read_jsonl, run_client, summaries

HEADER = "session_id,turn,prompt_tokens,output_tokens,arrival_offset_s,block_ids\n"


def _args(**kw) -> argparse.Namespace:
    base = {"seed": 7, "session_prefix": "", "block_tokens": 4, "phase": "replay", "max_in_flight": 0, "run_id": "r1"}
    return argparse.Namespace(**{**base, **kw})


def _turn(session: str, turn: int, blocks: str, tokens: int) -> workload.TraceTurn:
    return workload.TraceTurn(session, turn, tokens, 2, 0.0, 2, tuple(blocks.split()), "")


def test_a_block_is_the_same_tokens_across_sessions_of_a_repetition_and_new_tokens_in_the_next():
    a = _args()
    shared_1a = workload.replay_request(a, _turn("a", 1, "sys x1", 8), 1, workload.replay_salt(a, 1))
    shared_1b = workload.replay_request(a, _turn("b", 1, "sys y1", 8), 1, workload.replay_salt(a, 1))
    shared_2a = workload.replay_request(a, _turn("a", 1, "sys x1", 8), 2, workload.replay_salt(a, 2))
    ids = [[int(v) for v in r.prompt_json.split(b",")] for r in (shared_1a, shared_1b, shared_2a)]
    assert ids[0][:4] == ids[1][:4]          # block `sys` shared across sessions within repetition 1
    assert ids[0][4:] != ids[1][4:]          # x1 and y1 differ
    assert not set(pairwise(ids[0])) & set(pairwise(ids[2]))  # repetition 2: other tokens throughout
    assert workload.replay_salt(a, 2) == "r1:replay:r2"
    assert workload.replay_salt(_args(phase="capacity"), 1) != workload.replay_salt(a, 1)
    # without a salt the address is the one of before (block_prompt's other callers are unchanged)
    assert workload.block_prompt(7, ("sys",), 4, 4, "f") == workload.token_ids("7:block:sys", 4)


def test_each_repetition_records_its_salt_and_a_fresh_prompt(server_url, tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + "a,1,8,2,0,b1 b2\nb,1,8,2,0,b1 b3\n")
    out = tmp_path / "replay.jsonl"
    result = run_client("replay", "--url", server_url, "--arm", "fx", "--out", str(out), "--trace", str(path),
                        "--block-tokens", "4", "--repetitions", "2", "--evict", "reset", "--run-id", "job9")
    assert result.returncode == 0, result.stderr
    assert [(s["repetition"], s["salt"], s["ordered"]) for s in summaries(out)] == [
        (1, "job9:replay:r1", True), (2, "job9:replay:r2", True)]
    assert "salt=job9:replay:r2" in result.stdout


def _ordered_trace(tmp_path) -> str:
    # a1 is long; a2 comes 1 ms after it and must wait for its answer; b1 and c1 come later than a2 in the trace,
    # so in trace order neither may go before a2
    path = tmp_path / "trace.csv"
    path.write_text("session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\n"
                    "c,1,20,3,0.003\na,1,40,400,0\nb,1,30,3,0.002\na,2,60,3,0.001\n")
    return str(path)


def test_the_ordered_replay_sends_strictly_in_trace_order_and_a_turn_waits_for_its_answer(server_url, tmp_path):
    out = tmp_path / "capacity.jsonl"
    result = run_client("replay", "--url", server_url, "--arm", "fx", "--out", str(out), "--trace",
                        _ordered_trace(tmp_path), "--repetitions", "1", "--ordered", "--max-in-flight", "4",
                        "--phase", "capacity")
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out)
    assert [r["send_seq"] for r in records] == [0, 1, 2, 3]       # written in send order
    assert [(r["session"], r["turn"]) for r in records] == [("a", 1), ("a", 2), ("b", 1), ("c", 1)]
    assert all(x["t_send"] <= y["t_send"] for x, y in pairwise(records))
    assert records[1]["t_send"] >= records[0]["t_end"]             # a2 waited for a1's answer …
    assert records[2]["t_send"] >= records[0]["t_end"]             # … and b1, due before a1 ended, waited behind a2
    for r in records:
        assert r["send_lateness_s"] >= 0 and abs(r["t_send"] - r["t_scheduled"] - r["send_lateness_s"]) < 2e-6
    [summary] = summaries(out)
    # concurrency is what was measured in flight, the same in the records and their summary; the cap is apart
    assert {r["concurrency"] for r in records} == {summary["concurrency"]} == {summary["in_flight"]["max"]}
    assert 1 <= summary["in_flight"]["max"] <= 4 and {r["concurrency_cap"] for r in records} == {4}
    assert summary["concurrency_cap"] == 4 and 0 < summary["in_flight"]["mean"] <= summary["in_flight"]["max"]
    assert summary["lateness_s"]["count"] == 4
    assert not list(tmp_path.glob("capacity.pending*"))


def test_a_replay_capped_at_one_has_one_in_flight_and_says_so(server_url, tmp_path):
    out = tmp_path / "capacity.jsonl"
    result = run_client("replay", "--url", server_url, "--arm", "fx", "--out", str(out), "--trace",
                        _ordered_trace(tmp_path), "--repetitions", "1", "--max-in-flight", "1", "--phase", "capacity")
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out)
    assert [r["send_seq"] for r in records] == [0, 1, 2, 3]
    assert all(x["t_end"] <= y["t_send"] for x, y in pairwise(records))
    assert {(r["concurrency"], r["concurrency_cap"]) for r in records} == {(1, 1)}
    [summary] = summaries(out)
    assert summary["in_flight"]["max"] == 1 and summary["concurrency"] == 1


def test_the_unordered_replay_keeps_each_session_in_order_and_numbers_its_sends(server_url, tmp_path):
    out = tmp_path / "replay.jsonl"
    result = run_client("replay", "--url", server_url, "--arm", "fx", "--out", str(out), "--trace",
                        _ordered_trace(tmp_path), "--repetitions", "1", "--unordered")
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out)
    assert sorted(r["send_seq"] for r in records) == [0, 1, 2, 3]
    a = sorted((r for r in records if r["session"] == "a"), key=lambda r: r["turn"])
    assert a[1]["t_send"] >= a[0]["t_end"] and a[1]["send_seq"] > a[0]["send_seq"]
    assert {r["concurrency_cap"] for r in records} == {None}
    assert summaries(out)[0]["ordered"] is False


def test_in_flight_mean_is_weighted_by_time(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(workload.time, "monotonic", lambda: clock[0])
    st = workload.PhaseStats()
    for at, step in ((0, +1), (1, +1), (3, -1), (4, -1)):   # 1 for 1 s, 2 for 2 s, 1 for 1 s
        clock[0] = 100.0 + at
        st.change(step)
    assert st.in_flight_summary() == {"max": 2, "mean": 1.5}
    assert workload.PhaseStats().in_flight_summary() == {"max": 0, "mean": None}


def test_the_records_of_a_repetition_survive_a_kill_in_the_journal(tmp_path):
    recorder = workload.Recorder(str(tmp_path / "r.jsonl"), quiet=True)
    recorder.hold()
    recorder.write({"send_seq": 1, "status": "ok"})
    recorder.write({"send_seq": 0, "status": "ok"})
    [journal] = tmp_path.glob("r.pending-*")
    assert len(journal.read_text().splitlines()) == 2   # on disk before the repetition ends
    assert (tmp_path / "r.jsonl").read_text() == ""
    recorder.release(lambda r: r.update(concurrency=2))
    recorder.close()
    assert read_jsonl(tmp_path / "r.jsonl") == [{"send_seq": 0, "status": "ok", "concurrency": 2},
                                                {"send_seq": 1, "status": "ok", "concurrency": 2}]
    assert not journal.exists()


def test_a_terminated_replay_writes_what_finished_from_its_journal(start_server, tmp_path):
    import json
    import signal
    import subprocess
    import sys

    from tests.client.conftest import CLIENT
    url = start_server("--hang-after", "1")   # the first request is answered, the second never
    path = tmp_path / "trace.csv"
    path.write_text("session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,20,3,0\nb,1,20,3,0.001\n")
    out = tmp_path / "replay.jsonl"
    proc = subprocess.Popen([sys.executable, str(CLIENT), "replay", "--url", url, "--arm", "fx", "--out", str(out),
                             "--trace", str(path), "--repetitions", "1", "--max-in-flight", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # wait for the event (the first record in the journal), bounded only against a hang
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not any(p.read_text() for p in tmp_path.glob("replay.pending-*")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 143, stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["session"], r["send_seq"], r["concurrency_cap"]) for r in records] == [("a", 0, 4)]
    assert records[0]["concurrency"] >= 1
    assert not list(tmp_path.glob("replay.pending-*"))


def test_trace_arrivals_need_a_trace_with_two_arrival_times(server_url, tmp_path):
    path = tmp_path / "one.csv"
    path.write_text("session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,20,3,5\nb,1,20,3,5\n")
    result = run_client("soak", "--url", server_url, "--arm", "fx", "--out", str(tmp_path / "s.jsonl"),
                        "--duration-s", "1", "--rate", "5", "--arrivals", "trace", "--trace", str(path))
    assert result.returncode == 2
    assert f"--arrivals trace: {path} needs at least two different arrival offsets" in result.stderr
    assert not (tmp_path / "s.jsonl").exists() or (tmp_path / "s.jsonl").read_text() == ""
