"""Issue 44 item 1 and issue 43 item 3, in G4's sample: a sample whose working set exceeds HBM + DRAM (or says why
none affordable can), the sharing across sessions kept, the capped check with DRAM in front of FX, and the oracle
recomputed on the order the records show — each held to an independent count."""
from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from gates.traces import capacity, reference
from gates.traces.analysis import analyse
from gates.traces.formats import read_bytes
from gates.traces.sample import choose, cross_session_blocks
from runners import tracereplay
from tests.traces.helpers import mooncake_lines
from tests.traces.test_replay import conversations

BT = 512


def _rows(data: bytes) -> list[dict]:
    return list(csv.DictReader(io.StringIO(data.decode())))


def _reference_working_set(rows: list[dict], share: float = 0.95) -> int:
    """The fewest tokens whose LRU serves `share` of the rows' reuse, by the plain reference at every capacity."""
    ts = [float(r["arrival_offset_s"]) for r in rows]
    inp = [int(r["prompt_tokens"]) for r in rows]
    blocks = [r["block_ids"].split() for r in rows]
    ideal = reference.ideal_hit_tokens(ts, inp, blocks, BT)
    if ideal == 0:
        return 0
    for capacity_blocks in range(1, sum(len(b) for b in blocks) + 2):
        if reference.lru_hit_tokens(ts, inp, blocks, BT, capacity_blocks * BT) >= share * ideal - 1e-9:
            return capacity_blocks * BT
    raise AssertionError("no capacity serves the share")


def test_the_sample_grows_until_its_working_set_exceeds_hbm_and_dram():
    trace = mooncake_lines(conversations(n_sessions=60, turns=3)).encode()
    above = {"hbm_tokens": 12 * BT, "dram_tokens": 20 * BT}
    data, stats = tracereplay.prepare(trace, {"max_sessions": 4}, **above)
    sizing = stats["sizing"]
    assert sizing["needs_tier"] is True and sizing["above_fx_tokens"] == 32 * BT
    rows = _rows(data)
    assert sizing["working_set_tokens"] == _reference_working_set(rows) > 32 * BT
    # the tries before the last were too small: the smallest sample that needs the tier, not the whole trace
    assert all(a["working_set_tokens"] <= 32 * BT for a in sizing["attempts"][:-1])
    assert stats["sampled_requests"] < 180 and sizing["estimated_gpu_hours"] > 0
    assert "the sample needs the tier" in tracereplay.describe(stats)
    # the oracle states each tier's share of the sample (HBM, DRAM, FX with nothing capped: all the reuse)
    tiers = stats["oracle"]["tiers"]["overall"]["tokens"]
    assert tiers["hbm"] + tiers["dram"] + tiers["fx"] == stats["oracle"]["ideal_hit_tokens"] and tiers["fx"] > 0


def test_a_budget_too_small_says_so_with_the_numbers():
    trace = mooncake_lines(conversations(n_sessions=60, turns=3)).encode()
    _, stats = tracereplay.prepare(trace, {"max_requests": 6}, hbm_tokens=12 * BT, dram_tokens=20 * BT)
    sizing = stats["sizing"]
    assert sizing["needs_tier"] is False
    assert "no affordable sample needs the tier" in sizing["reason"] and "max_requests 6" in sizing["reason"]


def test_a_trace_that_fits_above_fx_does_not_need_the_tier():
    trace = mooncake_lines(conversations(n_sessions=6, turns=3)).encode()
    _, stats = tracereplay.prepare(trace, {}, hbm_tokens=1000 * BT, dram_tokens=0)
    assert stats["sizing"]["needs_tier"] is False and "fits in HBM + DRAM" in stats["sizing"]["reason"]


def _shared(n: int = 40) -> list[dict]:
    """Sessions of two turns; every fourth session's first turn reuses the three-block document the session
    before it brought in (blocks d*), the rest have prompts of their own."""
    out, t = [], 0
    for s in range(n):
        doc = [10_000 + 10 * (s // 4) + k for k in range(3)]
        first = doc + [s * 100 + 1] if s % 4 in (0, 1) else [s * 100 + 1, s * 100 + 2]
        out.append({"timestamp": t, "input_length": len(first) * BT, "output_length": 1, "hash_ids": first})
        out.append({"timestamp": t + 1000, "input_length": (len(first) + 1) * BT, "output_length": 1,
                    "hash_ids": first + [s * 100 + 9]})
        t += 2000
    return out


def test_the_sessions_that_brought_a_shared_prefix_come_with_the_sessions_that_reuse_it():
    analysis = analyse(read_bytes(mooncake_lines(_shared()).encode(), "shared.jsonl"))
    plain = choose(analysis, ratio=0.3, seed=3)
    kept = choose(analysis, ratio=0.3, seed=3, keep_shared=True)
    assert kept.stats["shared_sources_added"] > 0 and kept.index.size > plain.index.size

    def independent(sample) -> int:          # blocks two or more sessions of the sample use, counted plainly
        users: dict = {}
        for session, blocks in zip(sample.session, sample.blocks, strict=True):
            for b in blocks.tolist():
                users.setdefault(b, set()).add(session)
        return sum(len(u) >= 2 for u in users.values())

    for sample in (plain, kept):
        names = np.unique(np.array(sample.session, dtype=object), return_inverse=True)[1].reshape(-1)
        offsets = np.concatenate(([0], np.cumsum([b.size for b in sample.blocks])))
        ids = np.concatenate(sample.blocks)
        assert cross_session_blocks(names, offsets, ids) == independent(sample)
    assert independent(kept) > independent(plain)
    # every session that reuses a document has the session that brought it in
    for session, blocks, stratum in zip(kept.session, kept.blocks, kept.stratum, strict=True):
        if stratum == "shared_prefix":
            assert any(o != session and b.size and b[0] == blocks[0] for o, b in zip(kept.session, kept.blocks,
                                                                                        strict=True))


def test_the_capped_check_puts_dram_in_front_of_fx():
    requests = conversations(n_sessions=16)
    analysis = analyse(read_bytes(mooncake_lines(requests).encode(), "conv.jsonl"))
    found = capacity.plan(analysis, dram_tokens=6 * BT)
    assert found["applicable"] and found["dram_tokens"] == 6 * BT
    ts = [r["timestamp"] / 1000 for r in requests]
    inp = [r["input_length"] for r in requests]
    blocks = [r["hash_ids"] for r in requests]
    hbm, dram, fx = reference.tiered_hit_tokens(ts, inp, blocks, BT, 0, 6 * BT, found["capacity_tokens"])
    assert hbm == 0 and found["predicted_dram_hit_tokens"] == dram and found["predicted_fx_hit_tokens"] == fx
    assert found["predicted_hit_fraction"] == pytest.approx((dram + fx) / sum(inp))
    # a DRAM that holds the whole sample leaves FX nothing to show: not applicable, said as the sample
    assert capacity.plan(analysis, dram_tokens=10_000 * BT)["reason"] == "dram-holds-reuse"


def _prepared():
    return tracereplay.prepare(mooncake_lines(conversations(n_sessions=16)).encode(), {"sample_ratio": 1.0},
                               name="conv.jsonl", hbm_tokens=4 * BT, dram_tokens=4 * BT)


def test_the_oracle_recomputed_on_the_order_sent():
    data, stats = _prepared()
    check = stats["oracle"]["capacity_check"]
    assert check["applicable"] and check["scale"] == check["capacity_tokens"] / check["buy_capacity_tokens"]
    rows = _rows(data)
    in_trace_order = [(r["session_id"], int(r["turn"])) for r in rows]
    same = capacity.in_order(check, in_trace_order)
    assert same["faithful"] and same["inverted_pairs"] == 0
    assert same["predicted_in_order"] == pytest.approx(check["predicted_hit_fraction"])
    # sessions sent one after the other (a coroutine per session): many pairs the other way round
    by_session = sorted(in_trace_order, key=lambda k: (k[0], k[1]))
    moved = capacity.in_order(check, by_session)
    position = {k: i for i, k in enumerate(in_trace_order)}
    sent = [position[k] for k in by_session]
    independent = sum(sent[i] > sent[j] for i in range(len(sent)) for j in range(i + 1, len(sent)))
    assert moved["inverted_pairs"] == independent > 0 and not moved["faithful"]
    # the prediction for that order, by the plain reference (HBM off in the capped replay, DRAM, FX at the cap)
    ts = list(range(len(sent)))
    inp = [int(rows[i]["prompt_tokens"]) for i in sent]
    blocks = [rows[i]["block_ids"].split() for i in sent]
    _, dram, fx = reference.tiered_hit_tokens(ts, inp, blocks, BT, 0, 4 * BT, check["capacity_tokens"])
    assert moved["predicted_in_order"] == pytest.approx((dram + fx) / sum(inp))
    unknown = capacity.in_order(check, in_trace_order + [("nobody", 1)])
    assert not unknown["faithful"] and unknown["unknown"] == ["nobody/1"]


def test_a_system_prompt_every_session_shares_pulls_in_no_more_than_one_session():
    analysis = analyse(read_bytes(mooncake_lines(conversations(n_sessions=40)).encode(), "conv.jsonl"))
    kept = choose(analysis, ratio=0.25, seed=5, keep_shared=True)
    plain = choose(analysis, ratio=0.25, seed=5)
    # block 0 opens every prompt: the kept sessions bring it themselves, only the first of them finds it missing
    assert kept.stats["shared_sources_added"] <= 1
    assert len(set(kept.session)) - len(set(plain.session)) == kept.stats["shared_sources_added"]
