"""The reuse oracle's validity check and the stratified results."""
from __future__ import annotations

from gates.traces.fidelity import fidelity, strata


def record(arm, stratum, ttft, cached=0, rep=1, status="ok"):
    return {"arm": arm, "phase": "replay", "stratum": stratum, "t_send": 10.0, "t_first_token": 10.0 + ttft,
            "cached_tokens": cached, "repetition": rep, "status": status}


def test_the_replay_is_valid_only_when_it_reached_the_plans_share_of_the_trace_reuse():
    records = [record("fx", "returning", 1, cached=900, rep=1), record("fx", "returning", 1, cached=700, rep=2),
               record("recompute", "returning", 5, cached=0)]
    check = fidelity(records, oracle_hit_tokens=1000, share=0.8)
    assert check["measured_hit_tokens"] == 800 and check["reached"] == 0.8 and check["ok"]
    assert not fidelity(records, oracle_hit_tokens=1000, share=0.85)["ok"]


def test_strata_are_judged_apart_with_goodput():
    records = ([record("fx", "first", 4.0)] * 3 + [record("recompute", "first", 4.0)] * 3 +
               [record("fx", "returning", 0.5)] * 4 + [record("recompute", "returning", 5.0)] * 4 +
               [record("fx", "returning", 9.0, status="error")])
    result = strata(records, ttft_objective_s=1.0)
    first, returning = result["strata"]["first"], result["strata"]["returning"]
    assert first["speedup"] == 1.0 and not first["tier_can_help"]
    assert returning["speedup"] == 10.0 and returning["tier_can_help"]
    assert returning["fx"]["goodput"] == 4 / 5 and returning["recompute"]["goodput"] == 0.0
    assert result["little_reuse"] is False


def test_little_reuse_reads_as_the_traffic_not_as_an_fx_failure():
    result = strata([record("fx", "first", 4.0)], ideal_hit_fraction=0.02)
    assert result["little_reuse"] and "this traffic has little reuse" in result["summary"]
    assert "not an FX failure" in result["summary"]
