"""The replay keeps what the trace holds: content-addressed prompts, whole sessions, shared prefixes hit on the
simulated server as the trace's own reuse says they should."""
from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command

from gates.traces.analysis import analyse
from gates.traces.formats import read_trace
from gates.traces.sample import choose
from runners.remote import workload
from tests.sim.conftest import MODEL, REPO, SimNode, SimServer
from tests.traces.helpers import mooncake_lines, write


def conversations(n_sessions: int = 6, turns: int = 3) -> list[dict]:
    """Sessions that share a one-block system prompt (block 0) and extend their previous prompt each turn."""
    requests, next_id = [], 1
    history: dict[int, list[int]] = {}
    for turn in range(turns):
        for s in range(n_sessions):
            grow = 2
            ids = history.get(s, [0]) + list(range(next_id, next_id + grow))
            next_id += grow
            history[s] = ids
            requests.append({"timestamp": (turn * n_sessions + s) * 500, "input_length": len(ids) * 512,
                             "output_length": 4, "hash_ids": ids})
    return requests


def test_a_block_is_the_same_tokens_wherever_it_appears():
    a = workload.block_prompt(7, ("sys", "x1", "x2"), 16, 40, "fill-a")
    b = workload.block_prompt(7, ("sys", "y1"), 16, 20, "fill-b")
    assert a[:16] == b[:16] and a[16:32] != b[16:32]            # the shared block, then divergence
    assert len(a) == 40 and len(b) == 20
    longer = workload.block_prompt(7, ("sys", "x1", "x2", "x3"), 16, 64, "other")
    assert longer[:40] == a                                     # partial reuse: a prefix of the longer prompt
    assert workload.block_prompt(7, ("sys",), 16, 24, "f")[16:] == workload.token_ids("f", 8)


def test_sampling_takes_whole_sessions_spread_over_the_trace(tmp_path):
    requests = conversations(n_sessions=40, turns=3)
    analysis = analyse(read_trace(write(tmp_path, "t.jsonl", mooncake_lines(requests))))
    sample = choose(analysis, ratio=0.25, seed=1)
    kept = set(sample.session)
    assert 0 < len(kept) < 40
    by_session = {s: sample.session.count(s) for s in kept}
    assert set(by_session.values()) == {3}                       # every kept session whole
    assert sorted(sample.index.tolist()) != list(range(len(sample.index)))  # not the first N requests
    assert sample.stats["sampled_share"] == pytest.approx(len(sample.index) / 120)
    again = choose(analysis, ratio=0.25, seed=1)
    assert again.index.tolist() == sample.index.tolist()         # deterministic


def test_gap_cap_speedup_and_over_length_prompts_are_applied_and_counted(tmp_path):
    requests = [{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]},
                {"timestamp": 86_400_000, "input_length": 5000, "output_length": 10, "hash_ids": list(range(3, 13))},
                {"timestamp": 86_401_000, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}]
    analysis = analyse(read_trace(write(tmp_path, "t.jsonl", mooncake_lines(requests))))
    sample = choose(analysis, ratio=1.0, idle_gap_cap_s=60, speedup=2, max_model_len=4096)
    assert sample.offsets_s.tolist() == [0.0, 30.0, 30.5]
    assert sample.stats["idle_gaps_capped"] == 1 and sample.stats["cut_requests"] == 1
    assert int(sample.prompt_tokens[1]) + int(sample.output_tokens[1]) <= 4096
    assert len(sample.blocks[1]) == -(-int(sample.prompt_tokens[1]) // 512)
    out = choose(analysis, ratio=1.0, max_model_len=4096, over_length="out")
    assert out.stats["left_out_requests"] == 1 and len(out.index) == 2
    assert sample.stats["replay_rate_per_s"] == pytest.approx(3 / 30.5)


def test_a_sampled_mooncake_trace_hits_what_its_oracle_says_on_the_simulated_server(tmp_path):
    trace_path = write(tmp_path, "conv.jsonl", mooncake_lines(conversations()))
    replay = tmp_path / "replay.csv"
    stats = StringIO()
    call_command("trace", "sample", str(trace_path), "--ratio", "1", "--speedup", "5", "--out", str(replay),
                 stdout=stats)
    assert json.loads(stats.getvalue())["sampled_requests"] == 18
    # the oracle for the replayed sample: the hits the trace allows with an unbounded cache
    oracle = analyse(read_trace(replay))
    assert oracle.reuse is not None
    node = SimNode(tmp_path / "node1", scale=0.0005)
    server = SimServer(node, "fx").start()
    try:
        out = tmp_path / "records.jsonl"
        run = subprocess.run([sys.executable, str(REPO / "runners" / "remote" / "workload.py"), "replay", "--url",
                              server.url, "--arm", "fx", "--out", str(out), "--model", MODEL, "--trace", str(replay),
                              "--block-tokens", "512", "--repetitions", "1", "--evict", "reset", "--quiet"], capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, run.stderr
    finally:
        server.stop()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 18 and all(r["status"] == "ok" for r in records)
    assert {r["stratum"] for r in records} == {"first", "shared_prefix", "returning"}
    measured = sum(r["cached_tokens"] or 0 for r in records)
    expected = oracle.reuse.ideal_hit_tokens
    # requests 100 ms apart: each prefix is cached before the next request that needs it arrives (a request
    # that arrives while the one bringing its prefix is still in prefill misses it, which the oracle cannot see)
    assert expected * 0.95 <= measured <= expected, (measured, expected)
    shared = [r for r in records if r["stratum"] == "shared_prefix"]
    assert shared and all(r["cached_tokens"] == 512 for r in shared)   # the system block, across sessions
