"""Retrievals attributed to the GPU worker by vLLM's own process prefixes (gates/judge/lmcache_log.py)."""
from __future__ import annotations

from gates.judge import lmcache_log

LINE = ("\x1b[32;20m[2026-12-01 08:01:26,240] LMCache INFO:\x1b[0m [req_id=cmpl-1-0] Retrieved 2048 out of 2048 "
        "required tokens (from 2304 total tokens). size: 0.2344 gb, cost 45.1200 ms, throughput: 5.1900 GB/s; "
        "\x1b[4m(cache_engine.py:986:lmcache.v1.cache_engine)\x1b[0m")


def gpus(text: str) -> list[int]:
    return [r["gpu"] for r in lmcache_log.parse_log(text, run_id="r", arm="fx")]


def test_tensor_parallel_workers_are_their_tp_rank():
    text = "\n".join(f"(Worker_TP{rank} pid={4000 + rank}) {LINE}" for rank in (3, 0, 7))
    assert gpus(text) == [3, 0, 7]
    record = lmcache_log.parse_log(text, run_id="r", arm="fx")[0]
    assert (record["tokens"], record["gbps"], record["seconds"]) == (2048, 5.19, 0.04512)


def test_data_and_pipeline_parallel_workers_are_laid_out_on_the_node_grid():
    # DP 2 × TP 4: DP rank 1, TP rank 2 is the seventh GPU (index 6)
    text = "\n".join(f"(Worker_DP{dp}_TP{tp} pid=1) {LINE}" for dp in (0, 1) for tp in range(4))
    assert gpus(text) == list(range(8))
    text = "\n".join(f"(Worker_PP{pp}_TP{tp} pid=1) {LINE}" for pp in (0, 1) for tp in (0, 1))
    assert gpus(text) == [0, 1, 2, 3]


def test_a_coloured_prefix_and_a_plain_worker_are_read_too():
    assert gpus(f"\x1b[36m(Worker_TP5 pid=9)\x1b[0m {LINE}") == [5]
    assert gpus(f"(Worker pid=9) {LINE}") == [0]


def test_the_engine_cores_lines_and_zero_token_retrievals_are_not_retrievals():
    text = (f"(EngineCore pid=3) \x1b[32;20m[2026-12-01 08:01:26,240] LMCache INFO:\x1b[0m Reqid: x, Total tokens 10\n"
            f"(Worker_TP1 pid=4) {LINE.replace('Retrieved 2048', 'Retrieved 0')}\n")
    assert gpus(text) == []


# LMCache 0.3.1–0.3.3 print the retrieved count as a tensor's repr; 0.5.x with use_layerwise prints plain numbers
# after the request id. Neither carries size, cost or throughput.
OLD = ("\x1b[32;20m[2025-07-01 10:00:00,000] LMCache INFO:\x1b[0m Retrieved tensor(1536) out of 2048 out of total "
       "2304 tokens \x1b[3m(cache_engine.py:501:lmcache.v1.cache_engine)\x1b[0m")
LAYERWISE = ("\x1b[32;20m[2026-12-01 08:01:26,240] LMCache INFO:\x1b[0m [req_id=cmpl-7-0] Retrieved 2048 out of 2048 "
             "out of total 2304 tokens \x1b[3m(cache_engine.py:1146:lmcache.v1.cache_engine)\x1b[0m")


def test_lines_without_a_bandwidth_are_retrievals_that_say_so():
    for line, tokens in ((OLD, 1536), (LAYERWISE, 2048)):
        assert lmcache_log.looks_like_log(line)
        [record] = lmcache_log.parse_log(f"(Worker_TP2 pid=4) {line}", run_id="r", arm="fx")
        assert (record["tokens"], record["gpu"], record["bandwidth_logged"]) == (tokens, 2, False)
        assert record["gbps"] is None and record["bytes"] is None and record["seconds"] is None
    assert lmcache_log.parse_log(OLD.replace("tensor(1536)", "tensor(0)"), run_id="r", arm="fx") == []
    [current] = lmcache_log.parse_log(LINE, run_id="r", arm="fx")
    assert current["bandwidth_logged"] is True and current["tier"] is None


def test_the_tier_is_only_what_the_caller_attributes():
    [record] = lmcache_log.parse_log(LINE, run_id="r", arm="fx", tier="fx")
    assert record["tier"] == "fx"
