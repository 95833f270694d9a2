"""The client against the simulated server answering as vLLM 0.20.1 and as a newer version: a miss
without prompt_tokens_details is recorded as 0 cached tokens, and a reset the server refuses is a failed
eviction, never a reset. The judge then agrees with /metrics."""
from __future__ import annotations

import pytest

from gates.judge import counters, load_inputs
from tests.client.conftest import read_jsonl, run_client, summaries
from tests.sim.conftest import SimNode, SimServer

SMALL = ["--prompt-tokens", "1024", "--turn-tokens", "0", "--output-tokens", "4", "-c", "2", "--repetitions", "1",
         "--requests-per-client", "2", "--evict", "reset", "--run-id", "r1"]


@pytest.fixture
def sim(tmp_path):
    started = []

    def start(**env) -> SimServer:
        server = SimServer(SimNode(tmp_path / f"node{len(started)}", scale=0.0005), "fx", env=env).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_a_0201_miss_is_recorded_as_zero_and_the_judge_agrees_with_metrics(sim, tmp_path):
    server = sim()
    out = tmp_path / "fx.jsonl"
    result = run_client("cold-recovery", "--url", server.url, "--arm", "fx", "--out", str(out), *SMALL)
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out)
    populate = [r for r in records if r["phase"] == "populate"]
    measure = [r for r in records if r["phase"] == "measure"]
    assert [r["cached_tokens"] for r in populate] == [0] * len(populate)    # no details came: 0, not null
    assert all(r["cached_tokens"] == 1023 for r in measure)
    assert all(s["prompt_tokens_details"] is True and s["metrics_window"] for s in summaries(out))
    _, check = counters.reconcile(load_inputs([str(out), str(out.with_name("fx.summary.json"))]))
    assert check["ok"], check
    off = tmp_path / "off.jsonl"
    result = run_client("populate", "--url", server.url, "--arm", "fx", "--out", str(off), *SMALL,
                        "--prompt-tokens-details", "off", "--seed", "7")
    assert result.returncode == 0, result.stderr
    assert [r["cached_tokens"] for r in read_jsonl(off)] == [None] * 4


def test_a_reset_answering_success_false_is_a_failed_eviction(sim, tmp_path):
    server = sim(FXPILOT_SIM_VLLM_VERSION="0.32.0")
    out = tmp_path / "fx.jsonl"
    ok = run_client("evict", "--url", server.url, "--arm", "fx", "--out", str(out), "--evict", "reset")
    assert ok.returncode == 0 and "confirmed by the server" in ok.stdout
    server.node.set_faults(reset_refused=True)
    refused = run_client("evict", "--url", server.url, "--arm", "fx", "--out", str(out), "--evict", "reset")
    assert refused.returncode == 3
    assert "success: false" in refused.stderr and "was not reset" in refused.stderr
