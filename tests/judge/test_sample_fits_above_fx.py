"""A replayed sample whose working set fits in HBM + DRAM measures those caches, not FX (issue 44): a replay
criterion that would fail on it is marginal (a joint review decides), saying why with the figures — never an FX
failure; a sample that needs the tier is judged as before."""
from __future__ import annotations

from gates.judge import evaluate, synthetic
from tests.judge.test_replay_strata_capacity import PLAN, criterion, files


def _slow_fx_sample(needs_tier):
    frame = synthetic.gate_frames(4, slowdown={"fx": 4.0})    # FX no faster than the baselines on this replay
    sample = synthetic.replay_sample(frame)
    sample["sizing"] = {"needs_tier": needs_tier, "working_set_tokens": 437_000, "above_fx_tokens": 6_400_000,
                        "hbm_tokens": 6_300_000, "dram_tokens": 100_000}
    return evaluate(PLAN, 4, files(frame, sample=sample))


def test_a_sample_that_fits_above_fx_is_never_an_fx_failure():
    verdict = _slow_fx_sample(False)
    speedup = criterion(verdict, "g4-replay-speedup")
    assert speedup["verdict"] == "marginal" and speedup["sample_fits_above_fx"]
    assert speedup["explanation"].startswith("The replayed sample does not need the FX tier: its working set "
                                             "(437,000 tokens) fits in what sits above FX (HBM + DRAM: 6,400,000")
    assert "not an FX failure" in speedup["explanation"] and "而非 FX 的失败" in speedup["explanation_zh"]
    assert verdict["verdict"] != "fail"


def test_a_sample_that_needs_the_tier_is_judged_as_measured():
    speedup = criterion(_slow_fx_sample(True), "g4-replay-speedup")
    assert speedup["verdict"] == "fail" and "sample_fits_above_fx" not in speedup
