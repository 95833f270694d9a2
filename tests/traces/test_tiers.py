"""Issue 43 item 3: HBM, DRAM and FX as a cascade of LRU caches — the product (gates.traces.tiers, one reuse pass per
level) against the plain statement (gates.traces.reference.tiered_hit_tokens) on random traces."""
from __future__ import annotations

import pytest

from gates.traces import reference, tiers
from gates.traces.analysis import analyse
from gates.traces.formats import read_trace
from tests.traces.helpers import mooncake_lines, random_requests, write

BT = 4


@pytest.mark.parametrize("seed", range(25))
def test_the_cascade_is_the_reference_at_every_size(tmp_path, seed):
    requests = random_requests(seed, BT)
    analysis = analyse(read_trace(write(tmp_path, "r.jsonl", mooncake_lines(requests)), block_tokens=BT))
    ts = [r["timestamp"] / 1000 for r in requests]
    inp = [r["input_length"] for r in requests]
    blocks = [r["hash_ids"] for r in requests]
    for hbm, dram, fx in [(0, 0, None), (8, 0, None), (0, 12, None), (8, 12, None), (4, 40, 20), (16, 8, 8),
                          (0, 0, 12), (40, 40, 40), (12, 200, None)]:
        c = tiers.cascade(analysis, hbm, dram)
        got = (int(c.hbm.sum()), int(c.dram.sum()), int(c.fx(fx).sum()))
        assert got == reference.tiered_hit_tokens(ts, inp, blocks, BT, hbm, dram, fx), (hbm, dram, fx)
        if fx is None:   # unbounded FX: the three levels serve exactly the trace's ideal reuse
            assert sum(got) == analysis.reuse.ideal_hit_tokens


def test_the_report_states_each_tier_per_stratum(tmp_path):
    requests = [{"timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [1, 2, 3, 4]},
                {"timestamp": 1000, "input_length": 16, "output_length": 1, "hash_ids": [9, 8, 7, 6]},
                {"timestamp": 2000, "input_length": 20, "output_length": 1, "hash_ids": [1, 2, 3, 4, 5]},
                {"timestamp": 3000, "input_length": 24, "output_length": 1, "hash_ids": [9, 8, 7, 6, 10, 11]}]
    analysis = analyse(read_trace(write(tmp_path, "t.jsonl", mooncake_lines(requests)), block_tokens=BT))
    # HBM of 4 blocks holds only the request before; DRAM of 8 holds requests 0 and 1 when request 2 comes (its
    # 1-4 from DRAM), then takes request 2's five blocks and lets 9 go: request 3's 9-8-7-6 come from FX
    out = tiers.report(analysis, hbm_tokens=16, dram_tokens=32)
    overall = out["overall"]["tokens"]
    assert overall == {"hbm": 0, "dram": 16, "fx": 16, "recompute": 76 - 32}
    assert out["strata"]["returning"]["tokens"]["dram"] == 16 and out["fx_ideal_hit_tokens"] == 16
    small = tiers.report(analysis, hbm_tokens=0, dram_tokens=4)
    assert small["overall"]["tokens"]["fx"] == 32 and small["fx_capacity_for_share"]["0.5"] == 8 * BT
    # (FX sees 1-4, 9-6, 1-5, 9-6-10-11: 1 comes back 7 distinct blocks later, 9 eight later)
