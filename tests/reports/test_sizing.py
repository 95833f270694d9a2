"""The capacity to buy: KV bytes from the model's shape and KV dtype, sessions, overhead, redundancy, headroom, units."""
from __future__ import annotations

import pytest

from gates.sizing import SessionLengths, SizingSettingsError, compute, kv_dtype_from_flags, validate_settings

MODEL = "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8"


def test_an_fp8_kv_cache_halves_the_bytes_per_token_of_vllms_default():
    lengths = SessionLengths([1000], "customer-trace")
    auto = compute(model=MODEL, settings={}, lengths=lengths, sessions_kept=1)
    fp8 = compute(model=MODEL, settings={}, vllm_flags=["--kv-cache-dtype", "fp8"], lengths=lengths, sessions_kept=1)
    assert auto.kv_bytes_per_token == 253_952 and auto.kv_dtype == "bfloat16" and auto.kv_dtype_source == "vllm-default"
    assert fp8.kv_bytes_per_token == 126_976 and fp8.kv_dtype_source == "vllm-flag"
    assert kv_dtype_from_flags(["--kv-cache-dtype=fp8_e4m3"]) == "fp8_e4m3"


def test_the_units_follow_from_overhead_redundancy_headroom_and_the_unit_capacity():
    lengths = SessionLengths([10_000] * 9 + [65_000], "customer-trace")
    s = compute(model=MODEL, settings={"kv_cache_dtype": "fp8", "fs_overhead": 0.1, "redundancy": 2, "headroom": 0.2,
                                       "fx_unit_usable_tb": 50, "sessions_retained": 20_000},
                lengths=lengths, sessions_kept=10_000)
    assert s.session_tokens == 10_000 and s.stored_tokens == 10_240  # p90 of ten sessions is the ninth; whole chunks
    assert s.kv_bytes == 126_976 * 10_240 * 20_000
    assert s.capacity_bytes == pytest.approx(s.kv_bytes * 1.1 * 2 * 1.2)
    assert s.fx_units == 2 and s.missing == [] and s.customer_sessions


def test_without_the_unit_capacity_the_sizing_says_which_setting_is_missing():
    s = compute(model=MODEL, settings={}, lengths=SessionLengths([5000], "sample-trace"), sessions_kept=100)
    assert s.capacity_bytes and s.fx_units is None and "fx_unit_usable_tb" in s.missing and not s.customer_sessions
    unknown = compute(model="someone/else", settings={}, lengths=SessionLengths([], ""), sessions_kept=1)
    assert unknown.kv_bytes_per_token is None and {"layers", "session lengths"} <= set(unknown.missing)


@pytest.mark.parametrize(("settings", "named"), [
    ({"redundancy": 0.5}, "redundancy"), ({"fs_overhead": "ten"}, "fs_overhead"), ({"kv_cache_dtype": "int3"}, "kv_cache_dtype"),
    ({"fx_unit_usable_tb": 0}, "fx_unit_usable_tb"), ({"colour": "red"}, "colour"), ({"chunk_tokens": 2.5}, "chunk_tokens"),
])
def test_a_bad_sizing_setting_is_refused_by_name(settings, named):
    with pytest.raises(SizingSettingsError, match=named):
        validate_settings(settings)


def test_an_assumed_example_unit_capacity_is_said_wherever_the_unit_count_shows():
    from django.utils import translation

    from reports.words import sizing_sentences

    settings = {"kv_cache_dtype": "fp8", "fx_unit_usable_tb": 60, "fx_unit_usable_tb_basis": "assumed-example"}
    s = compute(model=MODEL, settings=settings, lengths=SessionLengths([50_000], "sample-trace"), sessions_kept=1000)
    assert s.fx_units == 1 and s.fx_unit_usable_tb_basis == "assumed-example"
    english = " ".join(sizing_sentences(s.as_dict(), "FX100"))
    assert "That is 1 FX100 unit(s)" in english and "assumed example figure for the demo" in english
    with translation.override("zh-hans"):
        chinese = " ".join(sizing_sentences(s.as_dict(), "FX100"))
    assert "假设的示例数值" in chinese and "assumed" not in chinese
    stated = compute(model=MODEL, settings={**settings, "fx_unit_usable_tb_basis": "stated"},
                     lengths=SessionLengths([50_000], "sample-trace"), sessions_kept=1000)
    assert "assumed" not in " ".join(sizing_sentences(stated.as_dict(), "FX100"))
    with pytest.raises(SizingSettingsError, match="fx_unit_usable_tb_basis"):
        validate_settings({"fx_unit_usable_tb_basis": "published"})
