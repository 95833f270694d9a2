"""G4 trace replay: a bad CSV is refused before anything is sent, naming the line and the column."""
from __future__ import annotations

import pytest

from runners.remote import workload
from tests.client.conftest import read_jsonl, run_client, summaries

HEADER = "session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\n"


@pytest.mark.parametrize("body, message", [
    ("", "the file is empty"),
    ("session_id,turn,prompt_tokens\n", "line 1: missing column(s) output_tokens, arrival_offset_s"),
    (HEADER, "the trace has a header but no rows"),
    (HEADER + "a,1,100,8,0\na,x,100,8,1\n", "line 3, column turn: 'x' is not a whole number"),
    (HEADER + "a,1,100,8,0\nb,1,-5,8,1\n", "line 3, column prompt_tokens: -5 is less than 1"),
    (HEADER + "a,1,100,8,soon\n", "line 2, column arrival_offset_s: 'soon' is not a number"),
    (HEADER + "a,1,100,8,nan\n", "line 2, column arrival_offset_s: 'nan' must be a finite number ≥ 0"),
    (HEADER + "a,1,100,8,0\na,1,200,8,1\n", "line 3, column turn: session 'a' turn 1 already on line 2"),
    (HEADER + "a,1,100\n", "line 2: 3 fields where the header has 5"),
    (HEADER + ",1,100,8,0\n", "line 2, column session_id: empty"),
])
def test_a_bad_trace_names_the_line_and_column(tmp_path, body, message):
    path = tmp_path / "trace.csv"
    path.write_text(body)
    with pytest.raises(workload.TraceError) as error:
        workload.load_trace(str(path))
    assert str(error.value).startswith((f"{path}: {message}", f"{path}, {message}")), str(error.value)


def test_a_bad_trace_sends_nothing(server_url, tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + "a,1,100,8,0\na,2,abc,8,1\n")
    out = tmp_path / "replay.jsonl"
    result = run_client("replay", "--url", server_url, "--arm", "fx", "--out", str(out), "--trace", str(path))
    assert result.returncode == 2
    assert "line 3, column prompt_tokens: 'abc' is not a whole number" in result.stderr
    assert not out.exists()


def test_replay_keeps_each_session_in_order_and_extends_its_prompt(server_url, tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + "a,1,100,4,0\nb,1,50,4,0.01\na,2,180,4,0.02\nc,1,30,4,0.5\n")
    out = tmp_path / "replay.jsonl"
    result = run_client("replay", "--url", server_url, "--arm", "fx", "--out", str(out), "--trace", str(path),
                        "--repetitions", "2", "--max-sessions", "2", "--evict", "reset")
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out)
    assert len(records) == 2 * 3 and {r["phase"] for r in records} == {"replay"}
    assert {r["session"] for r in records} == {"a", "b"}
    a = [r for r in records if r["session"] == "a" and r["repetition"] == 1]
    assert [r["turn"] for r in a] == [1, 2] and a[1]["t_send"] >= a[0]["t_end"]
    assert [r["prompt_tokens"] for r in a] == [100, 180]
    assert [s["repetition"] for s in summaries(out)] == [1, 2]
    turn1 = workload.token_ids("20260629:trace:a:1", 100)
    assert workload.token_ids("20260629:trace:a:1", 180)[:100] == turn1
