"""The capacity to buy follows from the customer's trace's reuse curve (issue 24, item 5)."""
from __future__ import annotations

import pytest

from gates.sizing import SessionLengths, compute, reuse_capacity
from gates.traces import read_trace
from gates.traces.analysis import analyse, report
from gates.traces.reuse import profile
from tests.traces.helpers import mooncake_lines, write
from tests.traces.test_replay import conversations

MODEL = "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8"


def test_the_capacity_is_the_lru_size_that_captures_the_share_times_kv_bytes(tmp_path):
    trace = read_trace(write(tmp_path, "conv.jsonl", mooncake_lines(conversations(n_sessions=30, turns=4))))
    reuse = report(analyse(trace))["reuse"]
    sizing = compute(model=MODEL, settings={"kv_cache_dtype": "fp8", "fx_unit_usable_tb": 60},
                     lengths=SessionLengths([100_000], "customer-trace"), sessions_kept=1000, reuse=reuse)
    tokens = reuse["capacity_for_share"]["0.95"]
    assert sizing.capacity_basis == "reuse-curve" and sizing.reuse["capacity_tokens"] == tokens
    assert sizing.kv_bytes == 126_976 * tokens
    assert sizing.capacity_bytes == pytest.approx(sizing.kv_bytes * 1.10 * 1.0 * 1.25)
    assert sizing.session_formula_bytes > sizing.capacity_bytes        # the old formula, kept for comparison
    # the capacity really captures the share on the trace's own LRU curve, and one block less does not
    p = profile(trace.block_offsets, trace.block_ids, trace.input_tokens, 512, trace.timestamps)
    assert p.lru_hit_tokens(tokens // 512) >= 0.95 * p.ideal_hit_tokens
    assert p.lru_hit_tokens(tokens // 512 - 1) < 0.95 * p.ideal_hit_tokens


def test_a_share_between_the_stated_ones_reads_the_curve_conservatively():
    reuse = {"known": True, "ideal_hit_fraction": 0.5, "block_tokens": 512, "capacity_for_share": {},
             "curve": [{"capacity_tokens": 512, "hit_fraction": 0.1}, {"capacity_tokens": 1024, "hit_fraction": 0.4},
                       {"capacity_tokens": 4096, "hit_fraction": 0.5}]}
    assert reuse_capacity(reuse, 0.7)["capacity_tokens"] == 1024     # 0.4 ≥ 0.7 × 0.5
    assert reuse_capacity(reuse, 0.9)["capacity_tokens"] == 4096
    assert reuse_capacity({"known": False}, 0.9) is None


def test_without_reuse_the_session_formula_stands():
    sizing = compute(model=MODEL, settings={"kv_cache_dtype": "fp8"}, lengths=SessionLengths([1000], "customer-trace"),
                     sessions_kept=10, reuse={"known": False, "reason": "Azure"})
    assert sizing.capacity_basis == "session-lengths" and sizing.kv_bytes == 126_976 * 1024 * 10
