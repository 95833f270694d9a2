"""The physical model, run in model time without a server: quantities, orderings and Table 1."""
import dataclasses

import pytest

from runners.sim.calibration import TABLE1, ColdRecovery, run_cell, table
from runners.sim.model import MI308X_NODE, QWEN3_CODER_480B, hbm_kv_capacity_tokens, step_seconds


def test_the_model_has_the_published_shape():
    assert round(QWEN3_CODER_480B.total_params / 1e9) == 480
    assert round(QWEN3_CODER_480B.active_params / 1e9) == 34
    assert QWEN3_CODER_480B.kv_bytes_per_token() == 2 * 62 * 8 * 128


def test_hbm_keeps_millions_of_tokens_after_the_weights():
    assert 5_000_000 < hbm_kv_capacity_tokens() < 8_000_000
    bf16 = dataclasses.replace(QWEN3_CODER_480B, kv_cache_bytes=2.0)
    assert hbm_kv_capacity_tokens(bf16) == pytest.approx(hbm_kv_capacity_tokens() / 2, rel=1e-3)


def test_attention_makes_a_long_prefill_chunk_cost_more():
    early = step_seconds(QWEN3_CODER_480B, MI308X_NODE, [(0, 8192)], [])
    late = step_seconds(QWEN3_CODER_480B, MI308X_NODE, [(57344, 8192)], [])
    assert late > 2 * early


def test_decode_steps_grow_with_the_batch():
    assert step_seconds(QWEN3_CODER_480B, MI308X_NODE, [], [49152] * 32) > \
        step_seconds(QWEN3_CODER_480B, MI308X_NODE, [], [49152] * 8)


def test_the_cold_recovery_workload_reproduces_table_1_within_15_percent():
    for cell, figures in table().items():
        ttft, throughput = TABLE1[cell]
        assert figures["ttft_p50"] == pytest.approx(ttft, rel=0.15), cell
        assert figures["throughput"] == pytest.approx(throughput, rel=0.15), cell


def test_a_degraded_fx_link_loses_the_gain_over_the_local_disk():
    local = run_cell("local_nvme", 16)
    degraded = run_cell("fx", 16, faults={"fx_degraded": 3.0})
    assert 1 - degraded["ttft_p50"] / local["ttft_p50"] < 0.20


def test_without_the_parallel_read_patch_fx_recovery_is_slower():
    assert run_cell("fx", 16, patched=False)["ttft_p50"] > 1.3 * run_cell("fx", 16)["ttft_p50"]


def test_a_slow_disk_slows_both_cache_arms():
    for arm in ("fx", "local_nvme"):
        assert run_cell(arm, 8, faults={"slow_disk": 2.0})["ttft_p50"] > run_cell(arm, 8)["ttft_p50"]


def test_longer_contexts_take_longer_to_recover():
    short = run_cell("fx", 8, ColdRecovery(context_tokens=16384))
    assert short["ttft_p50"] < run_cell("fx", 8)["ttft_p50"]
