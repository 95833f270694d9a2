"""Issue 44 item 7: the traces serving teams bring — WEKA kv-cache-tester, AIPerf's multi-turn mooncake_trace
(session_id + delay, text_input), Bailian, any of them gzipped — read as they are and held to independent counts;
and the cross-checks that refuse or warn naming the file, line and field."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from gates.traces import reference
from gates.traces.analysis import analyse, report
from gates.traces.formats import TraceFormatError, read_trace
from tests.traces.helpers import mooncake_lines, write


def _ideal(timestamps, inputs, blocks, block_tokens):
    return reference.ideal_hit_tokens(timestamps, inputs, blocks, block_tokens)


def _weka(cid, requests, block_size=64, **extra):
    return {"id": cid, "models": ["m"], "block_size": block_size, "hash_id_scope": "local", "tool_tokens": 0,
            "system_tokens": 0, "requests": requests, **extra}


def _call(t, tokens, ids, out=5, kind="n"):
    return {"t": t, "type": kind, "model": "m", "in": tokens, "out": out, "hash_ids": ids, "input_types": [],
            "output_types": [], "stop": "", "api_time": 0.5, "think_time": 0.1}


def test_weka_conversations_one_a_line_keep_their_block_ids_apart(tmp_path):
    # both conversations use local ids 1, 2, 3: the same numbers, not the same content
    a = _weka("conv-a", [_call(0.0, 128, [1, 2]), _call(4.0, 190, [1, 2, 3])])
    b = _weka("conv-b", [_call(0.0, 128, [1, 2]), _call(2.5, 256, [1, 2, 3, 4])])
    path = write(tmp_path, "weka.jsonl", json.dumps(a) + "\n" + json.dumps(b) + "\n")
    trace = read_trace(path)
    assert trace.format == "weka" and trace.block_tokens == 64 and trace.session_basis == "given"
    assert trace.session_names == ["conv-a", "conv-b"] and trace.timestamps.tolist() == [0.0, 4.0, 0.0, 2.5]
    analysis = analyse(trace)
    blocks = [["a1", "a2"], ["a1", "a2", "a3"], ["b1", "b2"], ["b1", "b2", "b3", "b4"]]
    expected = _ideal([0.0, 4.0, 0.0, 2.5], [128, 190, 128, 256], blocks, 64)
    assert analysis.reuse.ideal_hit_tokens == expected == 128 + 128
    assert any("start at 0 s" in w["message"] for w in trace.warnings)


def test_weka_one_pretty_printed_conversation_with_a_subagent(tmp_path):
    sub = {"t": 1.0, "type": "subagent", "agent_id": "agent_001", "subagent_type": "Explore", "status": "completed",
           "models": ["m"], "requests": [_call(1.5, 128, [1, 2]), _call(2.0, 192, [1, 2, 7], kind="s")]}
    conv = _weka("c", [_call(0.0, 64, [1]), sub, _call(3.0, 130, [1, 2, 5])])
    trace = read_trace(write(tmp_path, "trace_0001.json", json.dumps(conv, indent=2)))
    assert trace.format == "weka" and trace.requests == 4
    assert sorted(set(trace.session_names)) == ["c", "c::sa:agent_001"]
    expected = _ideal(trace.timestamps.tolist(), [64, 128, 192, 130], [[1], [1, 2], [1, 2, 7], [1, 2, 5]], 64)
    assert analyse(trace).reuse.ideal_hit_tokens == expected


def test_a_weka_request_without_its_token_count_is_named(tmp_path):
    conv = _weka("c", [_call(0.0, 64, [1]), {"t": 1.0, "type": "n", "model": "m", "out": 1, "hash_ids": []}])
    with pytest.raises(TraceFormatError) as error:
        read_trace(write(tmp_path, "w.jsonl", json.dumps(conv) + "\n"))
    assert "w.jsonl (WEKA kv-cache-tester JSON), line 1, field requests[1].in: missing" in str(error.value)


def test_aiperf_multi_turn_sessions_timed_by_delay(tmp_path):
    lines = [{"session_id": "s1", "timestamp": 1000, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
             {"session_id": "s2", "timestamp": 1500, "input_length": 512, "output_length": 10, "hash_ids": [9]},
             {"session_id": "s1", "delay": 2000, "input_length": 1536, "output_length": 10, "hash_ids": [1, 2, 3]},
             {"session_id": "s1", "delay": 500, "input_length": 2048, "output_length": 10, "hash_ids": [1, 2, 3, 4]}]
    trace = read_trace(write(tmp_path, "aiperf.jsonl", "".join(json.dumps(x) + "\n" for x in lines)))
    assert trace.format == "mooncake" and trace.session_basis == "given"
    assert trace.timestamps.tolist() == [1.0, 1.5, 3.0, 3.5]
    assert analyse(trace).reuse.ideal_hit_tokens == _ideal([1, 1.5, 3, 3.5], [1024, 512, 1536, 2048],
                                                           [[1, 2], [9], [1, 2, 3], [1, 2, 3, 4]], 512) == 1024 + 1536
    assert any(w["field"] == "delay" for w in trace.warnings)


def test_aiperf_text_input_turns_are_estimated_and_said(tmp_path):
    lines = [{"session_id": "s", "timestamp": 0, "text_input": "x" * 4000, "output_length": 100},
             {"session_id": "s", "delay": 1000, "text_input": "y" * 400, "output_length": 10},
             {"session_id": "t", "timestamp": 200, "text_input": "z" * 40, "output_length": 10}]
    trace = read_trace(write(tmp_path, "text.jsonl", "".join(json.dumps(x) + "\n" for x in lines)))
    # 4 bytes a token, each turn after the earlier turns and their answers (AIPerf's history mode)
    assert trace.input_tokens.tolist() == [1000, 1000 + 100 + 100, 10]
    assert trace.reuse_basis == "session-prefix"
    # the second turn extends the first: every full block of 1000 tokens (one block of 512) is reused
    assert analyse(trace).reuse.ideal_hit_tokens == 512
    assert any("estimated from text_input" in w["message"] for w in trace.warnings)


def test_bailian_sessions_follow_their_parents_in_16_token_blocks(tmp_path):
    lines = [{"chat_id": 159, "parent_chat_id": -1, "timestamp": 61.114, "input_length": 40, "output_length": 13,
              "type": "text", "turn": 1, "hash_ids": [1, 2, 3]},
             {"chat_id": 170, "parent_chat_id": -1, "timestamp": 61.5, "input_length": 20, "output_length": 8,
              "type": "text", "turn": 1, "hash_ids": [1, 9]},
             {"chat_id": 160, "parent_chat_id": 159, "timestamp": 62.5, "input_length": 70, "output_length": 8,
              "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4, 5]}]
    trace = read_trace(write(tmp_path, "qwen_traceA_blksz_16.jsonl", "".join(json.dumps(x) + "\n" for x in lines)))
    assert trace.format == "bailian" and trace.block_tokens == 16
    assert trace.session.tolist() == [0, 1, 0] and trace.session_names == ["159", "170"]
    expected = _ideal([61.114, 61.5, 62.5], [40, 20, 70], [[1, 2, 3], [1, 9], [1, 2, 3, 4, 5]], 16)
    assert analyse(trace).reuse.ideal_hit_tokens == expected == 16 + 48


def test_any_trace_gzipped_reads_as_the_plain_one(tmp_path):
    text = mooncake_lines([{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]},
                           {"timestamp": 1500, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 2]}])
    plain = read_trace(write(tmp_path, "m.jsonl", text))
    packed = tmp_path / "m.jsonl.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    zipped = read_trace(packed)
    assert zipped.format == "mooncake" and zipped.name == "m.jsonl.gz"
    assert report(analyse(zipped))["reuse"]["ideal_hit_tokens"] == report(analyse(plain))["reuse"]["ideal_hit_tokens"]
    odd = tmp_path / "no-suffix"            # told by its magic bytes, not its name
    odd.write_bytes(gzip.compress(text.encode()))
    assert read_trace(odd).requests == 2


def _sixty_four(n=20):
    out = []
    for i in range(n):
        tokens = 64 * (3 + i % 5) - 7
        out.append({"timestamp": 1000 * i, "input_length": tokens, "output_length": 1,
                    "hash_ids": [0] + [100 * i + k for k in range(1, -(-tokens // 64))]})
    return out


def test_a_64_token_block_trace_without_its_block_size_is_read_in_64_token_blocks(tmp_path):
    trace = read_trace(write(tmp_path, "m.jsonl", mooncake_lines(_sixty_four())))
    assert trace.block_tokens == 64 and trace.block_tokens_basis == "inferred"
    assert any("block size inferred: 64 tokens" in w["message"] for w in trace.warnings)
    # every request shares block 0 (64 tokens) with the one before
    assert analyse(trace).reuse.ideal_hit_tokens == 19 * 64


def test_a_stated_block_size_the_ids_do_not_fit_is_refused_naming_the_one_that_does(tmp_path):
    with pytest.raises(TraceFormatError) as error:
        read_trace(write(tmp_path, "m.jsonl", mooncake_lines(_sixty_four())), block_tokens=512)
    text = str(error.value)
    assert "m.jsonl (Mooncake/FAST'25 JSONL), line 1, field hash_ids: 3 block ids for 185 input tokens" in text
    assert "fit 64-token blocks: give that block size" in text


def test_seconds_written_where_milliseconds_belong_are_refused(tmp_path):
    requests = [{"timestamp": round(0.37 * i + 0.013 * (i % 3), 3), "input_length": 512, "output_length": 1,
                 "hash_ids": [i]} for i in range(30)]
    with pytest.raises(TraceFormatError) as error:
        read_trace(write(tmp_path, "m.jsonl", mooncake_lines(requests)))
    assert "line 1, field timestamp: the times look like seconds" in str(error.value)
    assert "30 requests would arrive within 0.0108 s" in str(error.value)


def test_a_session_id_missing_on_one_line_is_refused_naming_it(tmp_path):
    lines = [{"session_id": f"s{i % 4}", "timestamp": 100 * i, "input_length": 512, "output_length": 1,
              "hash_ids": [i]} for i in range(10)]
    del lines[6]["session_id"]
    with pytest.raises(TraceFormatError) as error:
        read_trace(write(tmp_path, "m.jsonl", "".join(json.dumps(x) + "\n" for x in lines)))
    assert ("line 7, field session_id: missing here, though 9 of the 10 requests name their session"
            in str(error.value))


def test_arrivals_out_of_order_are_counted_in_time_and_said(tmp_path):
    requests = [{"timestamp": t, "input_length": 512, "output_length": 1, "hash_ids": [i]}
                for i, t in enumerate([0, 1000, 2_000_000, 3000, 2_001_000, 2_002_000, 200_000])]
    trace = read_trace(write(tmp_path, "m.jsonl", mooncake_lines(requests)))
    (warning,) = [w for w in trace.warnings if w["field"] == "timestamp"]
    assert warning["values"]["count"] == "2" and warning["line"] == 4 and warning["values"]["jump"] == "1997"
    assert report(analyse(trace))["warnings"] == trace.warnings


def test_a_block_less_one_turn_csv_has_reuse_unknown_not_little(tmp_path):
    text = "session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\n" + "".join(
        f"s{i},1,{1000 + i},10,{i}\n" for i in range(5))
    found = report(analyse(read_trace(write(tmp_path, "one.csv", text))))
    assert found["reuse"]["known"] is False and found["reuse"]["summary"].startswith("reuse unknown")


@pytest.mark.parametrize("lines,named,not_named", [
    ([{"request_id": 0, "type": "text", "input_length": 446, "hash_ids": [1, 2]},
      {"request_id": 1, "type": "text", "input_length": 61, "output_length": 2370, "duration": 14000}],
     "ServeGen", "Mooncake"),
    ([{"id": "x", "models": ["m"], "requests": [{"t": 0, "type": "n", "in": 1, "out": 1}]}], "WEKA", "Mooncake"),
])
def test_a_refusal_names_the_format_the_file_looks_like(tmp_path, lines, named, not_named):
    with pytest.raises(TraceFormatError) as error:
        read_trace(write(tmp_path, "t.jsonl", "".join(json.dumps(x) + "\n" for x in lines)))
    assert named in str(error.value) and not_named not in str(error.value).split("expected")[0]


def test_the_counts_hold_on_random_weka_conversations_against_the_reference(tmp_path):
    rng = np.random.default_rng(7)
    convs, flat = [], []
    for c in range(6):
        reqs, t = [], 0.0
        for _ in range(int(rng.integers(1, 6))):
            n = int(rng.integers(1, 6))
            ids = [int(x) for x in rng.integers(0, 4, size=n)]
            tokens = 64 * n - int(rng.integers(0, 63))
            reqs.append(_call(t, tokens, ids))
            flat.append((t, tokens, [(c, x) for x in ids]))
            t += float(rng.integers(0, 3))
        convs.append(_weka(f"c{c}", reqs))
    trace = read_trace(write(tmp_path, "w.jsonl", "".join(json.dumps(x) + "\n" for x in convs)))
    expected = _ideal([f[0] for f in flat], [f[1] for f in flat], [f[2] for f in flat], 64)
    assert analyse(trace).reuse.ideal_hit_tokens == expected


def test_the_upload_path_reads_gzipped_traces_of_every_kind():
    from runners import traces as runner_traces
    text = mooncake_lines([{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]},
                           {"timestamp": 1500, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 2]}])
    found = runner_traces.analyse_bytes(gzip.compress(text.encode()), "conv.jsonl.gz")
    assert found["format"] == "mooncake" and found["turns"] == 2
    csv_text = ("session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\n"
                "a,1,1000,10,0\na,2,1600,10,4\nb,1,900,10,0.5\n")
    found = runner_traces.analyse_bytes(gzip.compress(csv_text.encode()), "sessions.csv.gz")
    assert found["format"] == "fxpilot" and found["sessions"] == 2
    assert len(runner_traces.parse(gzip.compress(csv_text.encode()), "sessions.csv.gz")) == 3
    with pytest.raises(runner_traces.TraceRefused, match="gzip"):
        runner_traces.analyse_bytes(gzip.compress(text.encode())[:30], "broken.gz")


def test_a_trace_on_disk_is_kept_in_chunks_past_16_mib_and_analysed_from_the_store(signed_pilot, settings, tmp_path):
    # issue 44 item 7: a day of traffic is hundreds of MB; receive_file never holds it whole (the portal's upload
    # cap, runners.validators.TRACE_MAX_BYTES, is raised here as the setting allows)
    from gates.models import CustomerTrace
    from runners import traces as runner_traces
    from tests.traces.helpers import run_trace_jobs

    settings.FXPILOT_TRACE_MAX_BYTES = 64 << 20
    lines = [{"timestamp": 10 * i, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1 + i % 3000]}
             for i in range(260_000)]
    path = tmp_path / "day.jsonl"
    path.write_text(mooncake_lines(lines))
    assert path.stat().st_size > 16 << 20
    packed = tmp_path / "day.jsonl.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    row = runner_traces.receive_file(signed_pilot.pilot, packed, "day.jsonl.gz", signed_pilot.bob, "customer")
    assert row.state == CustomerTrace.State.QUEUED and row.size == packed.stat().st_size
    assert run_trace_jobs() == ["ready"]
    row.refresh_from_db()
    assert row.turns == 260_000 and row.format == "mooncake"
    # block 0 everywhere, block 1 + i % 3000 again every 3,000 requests: 512 + (260,000 − 3,000) × 512 tokens
    assert row.analysis["reuse"]["ideal_hit_tokens"] == (260_000 - 1) * 512 + (260_000 - 3000) * 512


def test_a_weka_conversation_whose_block_size_comes_after_a_long_request_list_is_read_as_weka(tmp_path):
    calls = [_call(float(i), 64 * 40, list(range(40))) for i in range(300)]     # > 64 KiB before block_size
    conv = {"id": "long", "models": ["m"], "requests": calls, "block_size": 64, "hash_id_scope": "local"}
    path = write(tmp_path, "trace_long.json", json.dumps(conv, indent=1))
    trace = read_trace(path)
    assert trace.format == "weka" and trace.requests == 300
    assert analyse(trace).reuse.ideal_hit_tokens == 299 * 64 * 40
