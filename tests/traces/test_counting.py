"""The reuse counts of `trace analyze` against the plain-Python statement of issue 24's definitions."""
from __future__ import annotations

import numpy as np
import pytest

from gates.traces import read_trace, reference, reuse
from tests.traces.helpers import mooncake_lines, random_requests, write


def _columns(requests):
    return ([r["timestamp"] / 1000 for r in requests], [r["input_length"] for r in requests],
            [r["hash_ids"] for r in requests])


def test_a_worked_example_counts_as_vllm_does(tmp_path):
    """By hand, 512-token blocks: a 2-block LRU holds B, C after [A, B, C], so [A, B, D] misses A (the run
    stops at once) and leaves B, D, so [A, B] misses again; a 3-block LRU hits A B both times; an unbounded
    cache too. The third prompt has 700 tokens: its two hit blocks count min(2 × 512, 700) = 700."""
    requests = [
        {"timestamp": 0, "input_length": 1200, "output_length": 5, "hash_ids": [10, 11, 12]},   # A B C
        {"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [10, 11, 13]},  # A B D
        {"timestamp": 2000, "input_length": 700, "output_length": 5, "hash_ids": [10, 11]},       # A B
    ]
    path = write(tmp_path, "t.jsonl", mooncake_lines(requests))
    trace = read_trace(path)
    profile = reuse.profile(trace.block_offsets, trace.block_ids, trace.input_tokens, 512, trace.timestamps)
    assert profile.ideal_hit_tokens == 1024 + 700
    assert profile.lru_hit_tokens(2) == 0
    assert reference.lru_hit_tokens(*_columns(requests), 512, 2 * 512) == 0
    assert profile.lru_hit_tokens(3) == 1024 + 700
    assert reference.lru_hit_tokens(*_columns(requests), 512, 3 * 512) == 1024 + 700
    assert profile.lru_hit_tokens(0) == 0


@pytest.mark.parametrize("seed", range(120))
def test_random_traces_match_the_reference(tmp_path, monkeypatch, seed):
    block_tokens = [1, 16, 512][seed % 3]
    monkeypatch.setattr(reuse, "CHUNK", [1 << 22, 1, 2, 5][seed % 4])  # the sliced paths too
    requests = random_requests(seed, block_tokens)
    trace = read_trace(write(tmp_path, "t.jsonl", mooncake_lines(requests)), block_tokens=block_tokens)
    profile = reuse.profile(trace.block_offsets, trace.block_ids, trace.input_tokens, block_tokens,
                            trace.timestamps)
    ts, lengths, blocks = _columns(requests)
    assert profile.ideal_hit_tokens == reference.ideal_hit_tokens(ts, lengths, blocks, block_tokens)
    for capacity in (0, 1, 2, 3, 4, 6, 9, 14, 30, 1000):
        expected = reference.lru_hit_tokens(ts, lengths, blocks, block_tokens, capacity * block_tokens)
        assert profile.lru_hit_tokens(capacity) == expected, (seed, capacity)


def test_equal_timestamps_keep_file_order_and_later_lines_may_arrive_first(tmp_path):
    requests = [
        {"timestamp": 5000, "input_length": 512, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [2]},
        {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]},
    ]
    trace = read_trace(write(tmp_path, "t.jsonl", mooncake_lines(requests)))
    profile = reuse.profile(trace.block_offsets, trace.block_ids, trace.input_tokens, 512, trace.timestamps)
    # arrival order: line 2, line 3, line 1 → only line 1 (last to arrive) hits block 1
    assert list(profile.order) == [1, 2, 0]
    assert profile.ideal_hit_tokens == 512


def test_capacity_for_a_share_is_the_smallest_that_reaches_it(tmp_path):
    requests = random_requests(7, 16)
    trace = read_trace(write(tmp_path, "t.jsonl", mooncake_lines(requests)), block_tokens=16)
    profile = reuse.profile(trace.block_offsets, trace.block_ids, trace.input_tokens, 16, trace.timestamps)
    ideal = profile.ideal_hit_tokens
    assert ideal > 0
    for share in (0.5, 0.9, 1.0):
        blocks = profile.capacity_for(share)
        assert profile.lru_hit_tokens(blocks) >= share * ideal
        assert blocks == 0 or profile.lru_hit_tokens(blocks - 1) < share * ideal


def test_count_less_against_brute_force():
    rng = np.random.default_rng(3)
    values = rng.integers(0, 50, 400)
    weights = rng.integers(1, 5, 400)
    lo = rng.integers(0, 400, 200)
    hi = lo + rng.integers(0, 200, 200)
    xs = rng.integers(0, 60, 200)
    got = reuse.count_less(values, weights, lo, np.minimum(hi, 400), xs)
    want = [int(sum(w for v, w in zip(values[a:b], weights[a:b], strict=True) if v < x))
            for a, b, x in zip(lo, np.minimum(hi, 400), xs, strict=True)]
    assert got.tolist() == want
