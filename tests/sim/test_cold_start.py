"""The simulated server's start-up: a cold start (compile caches named and empty) takes its modelled time at the time
scale, says so, and fills the caches, so the next start with them is warm; without named caches it starts at once."""
from __future__ import annotations

import time

from runners.sim.model import COLD_START, QWEN3_CODER_480B
from tests.sim.conftest import SimServer

SCALE = 0.02


def caches(root) -> dict:
    return {"VLLM_CACHE_ROOT": str(root / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            "TRITON_CACHE_DIR": str(root / "triton")}


def started(server: SimServer) -> float:
    began = time.monotonic()
    server.start(wait=False)
    server.wait_healthy(timeout=600)
    return time.monotonic() - began


def test_a_cold_start_takes_the_modelled_time_and_the_next_start_is_warm(node, tmp_path):
    modelled = COLD_START.cold_seconds(QWEN3_CODER_480B)
    assert 380 < modelled < 400                      # weights 192 s + compile 150 s + graph capture 45 s
    env, scale = caches(tmp_path / "compile"), ("--sim-time-scale", str(SCALE))
    (tmp_path / "compile" / "vllm").mkdir(parents=True)          # named and empty: cold
    cold = SimServer(node, "recompute", env=env, args=scale, name="cold")
    try:
        took = started(cold)
    finally:
        cold.stop()
    assert took >= modelled * SCALE, took
    log = cold.log_text()
    assert "cold start (simulated): compile caches empty" in log
    assert "torch.compile takes 150.00 s in total (simulated, model time)" in log
    assert (tmp_path / "compile" / "vllm" / "torch_compile_cache" / "fxpilot-sim-compiled.json").is_file()
    assert (tmp_path / "compile" / "triton" / "fxpilot-sim-compiled.json").is_file()

    warm = SimServer(node, "recompute", env=env, args=scale, name="warm")
    try:
        took = started(warm)
    finally:
        warm.stop()
    assert "cold start" not in warm.log_text()
    assert took < modelled * SCALE, took


def test_without_named_compile_caches_the_server_starts_at_once(node):
    server = SimServer(node, "recompute", args=("--sim-time-scale", "1"), name="plain")
    try:
        took = started(server)
    finally:
        server.stop()
    assert took < 60 and "cold start" not in server.log_text()
