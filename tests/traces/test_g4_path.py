"""G4's path for a trace in a public format: accepted at upload, sampled and written for the workload client."""
from __future__ import annotations

import csv
import io

import pytest

from runners import tracereplay, traces
from runners.runs import sample_trace
from tests.traces.helpers import mooncake_lines
from tests.traces.test_replay import conversations


def test_a_mooncake_trace_is_accepted_where_it_was_refused_at_line_1():
    turns = traces.parse(mooncake_lines(conversations()).encode(), "conv.jsonl")
    assert len(turns) == 18 and max(t.turn for t in turns) == 3
    assert len({t.session_id for t in turns}) == 6                # sessions inferred from the blocks


def test_an_azure_trace_is_accepted_for_arrivals_and_lengths():
    data = b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
    assert [(t.prompt_tokens, t.output_tokens) for t in traces.parse(data, "azure.csv")] == [(374, 44)]


def test_a_bad_public_trace_is_refused_naming_format_line_and_field():
    with pytest.raises(traces.TraceRefused, match=r"conv.jsonl \(Mooncake/FAST'25 JSONL\), line 2, field hash_ids"):
        traces.parse(b'{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
                     b'{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": "x"}\n', "conv.jsonl")


def test_prepare_samples_whole_sessions_and_writes_block_ids():
    data, stats = tracereplay.prepare(mooncake_lines(conversations(n_sessions=40)).encode(),
                                      {"max_sessions": 10, "speedup": 2, "idle_gap_cap_s": 30}, name="conv.jsonl")
    rows = list(csv.DictReader(io.StringIO(data.decode())))
    sessions = {r["session_id"] for r in rows}
    assert 0 < len(sessions) < 40 and stats["selection"]["ratio"] == 0.25
    assert all(sum(r["session_id"] == s for r in rows) == 3 for s in sessions)   # whole sessions
    assert all(r["block_ids"].split()[0] == "0" for r in rows)                     # the shared system block
    assert stats["sampled_share"] == len(rows) / 120 and stats["format"] == "mooncake"
    oracle = stats["oracle"]          # what the replayed requests allow a cache: the fidelity check's reference
    assert 0 < oracle["ideal_hit_tokens"] and oracle["strata"]["returning"]["requests"] > 0
    line = tracereplay.describe(stats)
    assert f"replaying {len(rows)} of 120 requests" in line and "speed-up 2" in line


def test_the_generated_sample_trace_keeps_its_sessions_and_gains_implied_blocks():
    data, stats = tracereplay.prepare(sample_trace(), {"max_sessions": 64})
    rows = list(csv.DictReader(io.StringIO(data.decode())))
    assert stats["sampled_requests"] == 72 and stats["reuse_basis"] == "session-prefix"
    first = {r["session_id"]: r for r in rows if r["turn"] == "1"}
    later = [r for r in rows if r["turn"] == "2"]
    assert all(r["block_ids"].split()[:3] == first[r["session_id"]]["block_ids"].split()[:3] for r in later)


def test_prompts_over_the_context_are_cut_and_counted():
    _, stats = tracereplay.prepare(sample_trace(), {"max_model_len": 20000})
    assert stats["over_length_requests"] > 0 and stats["cut_requests"] == stats["over_length_requests"]
    assert "over max_model_len cut" in tracereplay.describe(stats)
    assert tracereplay.max_model_len(["--port", "1", "--max-model-len", "131072"]) == 131072
    assert tracereplay.max_model_len(["--max-model-len=8192"]) == 8192


@pytest.mark.parametrize("data, english, chinese", [
    (b'{"timestamp": 0, "input_length": "x", "output_length": 1, "hash_ids": []}\n',
     "c.jsonl (Mooncake/FAST'25 JSONL), line 1, field input_length: 'x' is not a whole number",
     "c.jsonl（Mooncake/FAST'25 JSONL），第 1 行，字段 input_length：'x' 不是整数"),
    (b"TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,5\n",
     "c.jsonl (Azure LLM inference CSV), line 1: missing column(s) GeneratedTokens; the header must name "
     "TIMESTAMP,ContextTokens,GeneratedTokens", "c.jsonl（Azure LLM inference CSV），第 1 行：缺少列 GeneratedTokens"),
    (b"TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,1\n",
     "c.jsonl (Azure LLM inference CSV), line 2, field TIMESTAMP: 'yesterday' is not a time like 2023-11-16 18:15:46.6805900",
     "第 2 行，字段 TIMESTAMP：'yesterday' 不是形如 2023-11-16 18:15:46.6805900 的时间"),
])
def test_a_public_format_complaint_names_the_format_and_reads_in_chinese(data, english, chinese):
    from django.utils import translation
    with translation.override("en"), pytest.raises(traces.TraceRefused) as refused:
        traces.parse(data, "c.jsonl")
    assert str(refused.value) == english
    with translation.override("zh-hans"), pytest.raises(traces.TraceRefused) as refused:
        traces.parse(data, "c.jsonl")
    assert chinese in str(refused.value), str(refused.value)


def test_the_g4_report_states_the_replays_fidelity_and_strata_in_both_languages():
    from django.template.loader import render_to_string
    from django.utils import translation

    from gates.traces.fidelity import fidelity, strata

    records = [{"arm": arm, "phase": "replay", "status": "ok", "repetition": 1, "stratum": stratum,
                "cached_tokens": 400 if arm == "fx" and stratum != "first" else 0, "t_send": 0.0,
                "t_first_token": (0.1 if arm == "fx" and stratum != "first" else 1.0)}
               for arm in ("fx", "recompute") for stratum in ("first", "returning", "returning")]
    trace = {"customer": True, "name": "conv.jsonl", "sessions": 1, "sha256": "0" * 64, "lengths": {},
             "fidelity": {"checks": [dict(fidelity(records, 1000, 0.8), arm="fx")],
                          "strata": strata(records, 0.5, ideal_hit_fraction=0.5)}}
    english = render_to_string("reports/_trace.html", {"trace": trace})
    assert "reached a share of 80.0 %" in english and "Reached." in english and "returning turns" in english
    assert "the tier cannot help" in english and "×10.00" in english
    assert "goodput, FX / recompute (TTFT ≤ 0.5 s)" in english and "100.0 % / 0.0 %" in english    # item 6
    with translation.override("zh-hans"):
        chinese = render_to_string("reports/_trace.html", {"trace": trace})
    assert "已达到。" in chinese and "后续轮次请求" in chinese and "Reached" not in chinese and "有效吞吐" in chinese
