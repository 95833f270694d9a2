"""The shipped workload client runs cold recovery against the simulated server; the simcheck arithmetic."""
import json
import socket
import subprocess
import sys
import urllib.request
from io import StringIO

from runners.management.commands.simcheck import Command, cell_figures
from runners.sim.calibration import TABLE1
from tests.sim.conftest import MODEL, REPO, prompt_ids


def test_cold_recovery_with_the_workload_client_hits_the_tier_after_eviction(node, servers, tmp_path):
    server = servers(node, "local_nvme")
    out = tmp_path / "records.jsonl"
    subprocess.run([sys.executable, str(REPO / "runners" / "remote" / "workload.py"), "cold-recovery", "--url",
                    server.url, "--arm", "local_nvme", "--out", str(out), "--model", MODEL, "--prompt-tokens", "2048",
                    "--turn-tokens", "64", "--output-tokens", "4", "-c", "2,4", "--repetitions", "2",
                    "--requests-per-client", "1", "--evict", "reset", "--quiet"], check=True, timeout=600)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    measured = [r for r in records if r["phase"] == "measure"]
    assert len(measured) == 2 * (2 + 4) and all(r["status"] == "ok" and r["simulated"] for r in measured)
    assert all(r["cached_tokens"] == 2048 for r in measured)
    summaries = [json.loads(line) for line in (tmp_path / "records.summary.json").read_text().splitlines()]
    after_eviction = [s for s in summaries if s["phase"] == "measure"]
    assert after_eviction and all(s["metrics_after"]["vllm:prefix_cache_hits_total"]
                                  == s["metrics_before"]["vllm:prefix_cache_hits_total"] for s in after_eviction)
    figures = cell_figures(measured, scale=1.0)
    assert set(figures) == {2, 4} and figures[4]["hit_ratio"] > 0.9 and figures[4]["failed"] == 0


def test_a_client_that_goes_away_mid_stream_does_not_stall_the_server(node, servers):
    server = servers(node, "recompute", args=("--sim-time-scale", "0.01"))
    body = json.dumps({"model": MODEL, "prompt": prompt_ids(512), "max_tokens": 2000, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        received = b""
        while b"data: " not in received:
            received += sock.recv(4096)
    answer = server.complete(prompt_ids(256, seed=3), max_tokens=3)
    assert len(answer["ids"]) == 3
    with urllib.request.urlopen(server.url + "/metrics") as response:
        assert f'vllm:num_requests_running{{model_name="{MODEL}",engine="0"}} 0' in response.read().decode()


def test_simcheck_reports_every_cell_and_its_worst_error():
    results = {cell: {"ttft_p50": ttft, "throughput": tps, "hit_ratio": 0.99, "failed": 0}
               for cell, (ttft, tps) in TABLE1.items()}
    results[("fx", 8)] = {**results[("fx", 8)], "ttft_p50": 7.53 * 1.2}
    command = Command(stdout=StringIO())
    assert round(command.report(results, 0.15), 3) == 0.2
    printed = command.stdout.getvalue()
    assert "+20.0% !" in printed and printed.count("\n") == len(TABLE1) + 1
    del results[("recompute", 16)]
    assert command.report(results, 0.15) == float("inf")


def test_the_soak_cycles_over_more_than_hbm_holds_so_every_judged_window_reads_the_tier(node, servers, tmp_path):
    """A soak whose sessions fit in HBM is answered from HBM after their first visits and never reaches the tier it
    soaks (the default plan's 32 sessions × 64 Ki tokens against 6.35 M tokens of HBM): the client sizes its pool
    from the server's vllm:cache_config_info, and every window after the warm-up reads the tier alike."""
    # a server with little HBM (the weights leave 7.7 GB of KV: 60 Ki tokens), so the pool stays small
    server = servers(node, "fx", args=("--gpu-memory-utilization", "0.38"))
    with urllib.request.urlopen(server.url + "/metrics") as response:
        text = response.read().decode()
    from runners.remote.workload import hbm_tokens, soak_pool

    hbm = hbm_tokens(text)
    assert hbm is not None and 55_000 < hbm < 65_000, text
    out = tmp_path / "soak.jsonl"
    subprocess.run([sys.executable, str(REPO / "runners" / "remote" / "workload.py"), "soak", "--url", server.url,
                    "--arm", "fx", "--out", str(out), "--model", MODEL, "--prompt-tokens", "4096", "--turn-tokens", "64",
                    "--output-tokens", "4", "-c", "2", "--duration-s", "6", "--windows", "3", "--quiet"],
                   check=True, timeout=600)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    summaries = [json.loads(line) for line in (tmp_path / "soak.summary.json").read_text().splitlines()]
    assert [s["repetition"] for s in summaries] == [1, 2, 3]  # one per window, one /metrics pair for them all
    summary = summaries[0]
    pool = summary["soak_sessions"]
    assert summary["hbm_tokens"] == hbm and pool == soak_pool(2, 4096, hbm) and pool * 4096 > hbm > 4 * 4096
    assert len({r["session"] for r in records}) == pool
    returning = [r for r in records if r["turn"] > 1]
    assert {r["repetition"] for r in returning} >= {2, 3}, "the pool was visited twice in the judged windows"
    assert all(r["status"] == "ok" and r["cached_tokens"] == 4096 for r in returning)
    # what came back came from the tier, not from HBM: the returning visits' 4,096 tokens are external hits
    before, after = summary["metrics_before"], summary["metrics_after"]
    external = after["vllm:external_prefix_cache_hits_total"] - before.get("vllm:external_prefix_cache_hits_total", 0)
    hbm_hits = after["vllm:prefix_cache_hits_total"] - before.get("vllm:prefix_cache_hits_total", 0)
    assert external >= 0.95 * 4095 * len(returning) and hbm_hits < 0.05 * 4096 * len(returning), (external, hbm_hits)
