"""Each public format read as it is, detected and named; a bad file names the line and the field."""
from __future__ import annotations

import numpy as np
import pytest

from gates.traces import TraceFormatError, read_trace
from gates.traces.analysis import analyse
from tests.traces.helpers import mooncake_lines, write

AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.6805900,4808,10\n"
         "2023-11-16 18:15:50.0000001,3180,8\n"
         "2023-11-16 18:16:00.1234567,110,27\n")
BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n"
            "45,GPT-4,1087,230,1317,API log\n")
BURSTGPT_SESSIONS = ("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "5,u1,1.5,ChatGPT,472,18,490,Conversation log\n"
                     "9,u2,0.5,ChatGPT,100,10,110,Conversation log\n"
                     "45,u1,2.0,ChatGPT,1087,230,1317,Conversation log\n")
FXPILOT = ("session_id,turn,prompt_tokens,output_tokens,arrival_offset_s,block_ids\n"
           "a,1,1000,10,0,sys a1\n"
           "b,1,900,10,0.5,sys b1\n"
           "a,2,1600,10,4,sys a1 a2 a3\n")


def test_mooncake_is_detected_and_read(tmp_path):
    text = mooncake_lines([{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]},
                           {"timestamp": 1500, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 2]}])
    trace = read_trace(write(tmp_path, "m.jsonl", text))
    assert trace.format == "mooncake" and trace.block_tokens == 512 and trace.reuse_basis == "block-ids"
    assert trace.timestamps.tolist() == [0.0, 1.5] and trace.input_tokens.tolist() == [600, 1100]
    assert trace.blocks(1).tolist() == [0, 1, 2]


def test_mooncake_in_another_key_order_with_session_ids_takes_the_careful_path(tmp_path):
    text = ('{"hash_ids": [5, 6], "output_length": 2, "input_length": 1000, "timestamp": 0, "session_id": "x"}\n'
            "\n"
            '{"session_id": "x", "timestamp": 10.5, "input_length": 1500, "output_length": 1, "hash_ids": [5, 6, 7]}\n')
    trace = read_trace(write(tmp_path, "m.jsonl", text))
    assert trace.session_basis == "given" and trace.session_names == ["x"]
    assert trace.lines.tolist() == [1, 3] and trace.timestamps.tolist() == [0.0, 0.0105]


def test_azure_keeps_all_seven_fractional_digits(tmp_path):
    trace = read_trace(write(tmp_path, "AzureLLMInferenceTrace_conv.csv", AZURE))
    assert trace.format == "azure" and not trace.reuse_known and "no prompt content" in trace.reuse_reason
    assert trace.timestamps[1] == pytest.approx(3.3194101, abs=1e-9)
    assert trace.timestamps[2] == pytest.approx(13.4428667, abs=1e-9)
    assert trace.input_tokens.tolist() == [4808, 3180, 110]


def test_azure_with_a_time_zone(tmp_path):
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,10,1\n"
            "2024-05-10 02:00:01.009930+02:00,10,1\n")
    trace = read_trace(write(tmp_path, "a.csv", text))
    assert trace.timestamps.tolist() == [0.0, 1.0]


def test_burstgpt_without_and_with_sessions(tmp_path):
    plain = read_trace(write(tmp_path, "b.csv", BURSTGPT))
    assert plain.format == "burstgpt" and plain.session is None and not plain.reuse_known
    assert analyse(plain).sessions == 2
    sessions = read_trace(write(tmp_path, "b2.csv", BURSTGPT_SESSIONS))
    assert sessions.session_basis == "given" and sessions.session.tolist() == [0, 1, 0]


def test_fxpilot_csv_with_block_ids_expresses_shared_and_partial_reuse(tmp_path):
    trace = read_trace(write(tmp_path, "f.csv", FXPILOT))
    assert trace.format == "fxpilot" and trace.reuse_basis == "block-ids"
    assert trace.blocks(0).tolist() == trace.blocks(2).tolist()[:2]
    assert trace.blocks(1)[0] == trace.blocks(0)[0]       # the shared "sys" block


def test_fxpilot_csv_without_block_ids_implies_the_session_prefix(tmp_path):
    text = "session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,1000,10,0\na,2,1600,10,5\n"
    trace = read_trace(write(tmp_path, "f.csv", text))
    assert trace.reuse_basis == "session-prefix"
    first, second = trace.blocks(0).tolist(), trace.blocks(1).tolist()
    assert len(first) == 2 and len(second) == 4
    assert second[0] == first[0] and second[1] != first[1]    # the partial block of turn 1 is its own


@pytest.mark.parametrize("name, text, message", [
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\nnot json\n',
     "m.jsonl (Mooncake/FAST'25 JSONL), line 2: not a JSON object"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
                '{"timestamp": 1, "input_length": 5, "output_length": 1}\n',
     "m.jsonl (Mooncake/FAST'25 JSONL), line 2, field hash_ids: missing here, though 1 of the 2 requests"),
    ("m.jsonl", '{"timestamp": -4, "input_length": 5, "output_length": 1, "hash_ids": []}\n',
     "line 1, field timestamp: -4 must be a finite number ≥ 0"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "b"]}\n',
     "line 1, field hash_ids: 'b' is not a whole-number block id"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [99999999999999999999]}\n',
     "line 1, field hash_ids: 99999999999999999999 is out of range"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,5,1\n2023-11-16 25:00:00,5,1\n",
     "a.csv (Azure LLM inference CSV), line 3, field TIMESTAMP: '2023-11-16 25:00:00' is not a valid time"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,five,1\n",
     "line 2, field ContextTokens: 'five' is not a whole number"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,5\n",
     "line 2: 2 fields where the header has 3"),
    ("b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,x,3,-1,2,API log\n",
     "b.csv (BurstGPT CSV), line 2, field Response tokens: -1 is less than 0"),
    ("f.csv", "session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,10,1,0\na,1,20,1,1\n",
     "f.csv (fxpilot session CSV), line 3, field turn: session 'a' turn 1 already on line 2"),
    ("f.csv", "session_id,turn,prompt_tokens,output_tokens,arrival_offset_s,block_ids\na,1,10,1,0,x y\n",
     "line 2, field block_ids: 2 block ids for 10 prompt tokens"),
    ("x.csv", "session,prompt\n1,2\n", "x.csv, line 1: not a trace format fxpilot reads"),
    ("e.csv", "", "e.csv: the file is empty"),
])
def test_a_bad_file_names_the_line_and_the_field(tmp_path, name, text, message):
    with pytest.raises(TraceFormatError) as error:
        read_trace(write(tmp_path, name, text))
    assert message in str(error.value), str(error.value)


def test_a_format_forced_on_the_wrong_file_names_the_format_and_its_columns(tmp_path):
    with pytest.raises(TraceFormatError) as error:
        read_trace(write(tmp_path, "b.csv", BURSTGPT), "azure")
    assert str(error.value) == ("b.csv (Azure LLM inference CSV), line 1: missing column(s) TIMESTAMP, "
                                "ContextTokens, GeneratedTokens; the header must name TIMESTAMP,ContextTokens,"
                                "GeneratedTokens")


def test_a_bad_line_deep_in_a_large_file_is_named(tmp_path, monkeypatch):
    from gates.traces import formats
    monkeypatch.setattr(formats, "CHUNK_BYTES", 1000)     # many chunks: the line count carries across them
    lines = [{"timestamp": i, "input_length": 10, "output_length": 1, "hash_ids": [i % 7]} for i in range(500)]
    text = mooncake_lines(lines).splitlines(keepends=True)
    text[436] = text[436].replace('"input_length": 10', '"input_length": 1.5')
    with pytest.raises(TraceFormatError) as error:
        read_trace(write(tmp_path, "m.jsonl", "".join(text)))
    assert "line 437, field input_length: 1.5 is not a whole number" in str(error.value)
    good = read_trace(write(tmp_path, "ok.jsonl", mooncake_lines(lines)))
    assert good.requests == 500 and good.lines.tolist() == list(range(1, 501))
    assert np.array_equal(good.block_ids, np.array([i % 7 for i in range(500)]))
