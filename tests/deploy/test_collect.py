"""Collection over real SSH: files come back as artifacts hashed on both ends; /metrics read from the node."""
from __future__ import annotations

import http.server
import threading

import pytest

from runners.artifacts import read_artifact
from runners.deploy import DeployError, collect, metrics_snapshot, parse_metrics

METRICS = """# HELP vllm:prefix_cache_hits_total GPU prefix cache hits, in tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="qwen"} 1024.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="qwen"} 65536.0
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 70000.0
vllm:prompt_tokens_total{engine="1",model_name="qwen"} 30000.0
lmcache:num_hit_tokens 65536
"""


@pytest.fixture
def metrics_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = METRICS.encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_files_come_back_as_artifacts_and_again_as_the_same_ones(sim_nodes):
    node, root = sim_nodes.nodes[0], sim_nodes.servers[0].root
    records = root / "fxpilot-runs" / "r1" / "records.jsonl"
    records.parent.mkdir(parents=True, exist_ok=True)
    records.write_text('{"schema": "fxpilot.request/1", "simulated": true}\n')
    (root / "fxpilot-runs" / "r1" / "records.jsonl.summary.json").write_text('{"schema": "fxpilot.phase/1"}\n')
    paths = ["~/fxpilot-runs/r1/records.jsonl", "~/fxpilot-runs/r1/records.jsonl.summary.json"]
    first = collect(sim_nodes.job, None, node, paths)
    assert [(a.name, a.kind, a.simulated) for a in first] == [("node1/records.jsonl", "records", True),
                                                              ("node1/records.jsonl.summary.json", "phase-summary", True)]
    assert read_artifact(first[0]) == records.read_bytes()
    assert [a.pk for a in collect(sim_nodes.job, None, node, paths)] == [a.pk for a in first]


def test_a_missing_file_is_named_and_the_rest_is_kept(sim_nodes):
    node, root = sim_nodes.nodes[1], sim_nodes.servers[1].root
    (root / "kept.log").write_text("server log\n")
    with pytest.raises(DeployError, match=r"collected 1 file\(s\), but missing: ~/not-there.jsonl"):
        collect(sim_nodes.job, None, node, {"~/kept.log": "node2/kept.log", "~/not-there.jsonl": "node2/x.jsonl"})
    assert sim_nodes.job.artifacts.filter(name="node2/kept.log", kind="server-log").exists()


def test_a_metrics_snapshot_is_read_from_the_node_and_kept(sim_nodes, metrics_server):
    node = sim_nodes.nodes[0]
    values = metrics_snapshot(node, metrics_server, job=sim_nodes.job, name="node1/fx/metrics-before.prom")
    assert values["vllm:external_prefix_cache_hits_total"] == 65536.0
    assert values["vllm:prompt_tokens_total"] == 100000.0
    assert values["lmcache:num_hit_tokens"] == 65536.0
    kept = sim_nodes.job.artifacts.get(name="node1/fx/metrics-before.prom")
    assert kept.kind == "metrics" and read_artifact(kept).decode() == METRICS


def test_a_metrics_url_off_the_nodes_loopback_is_refused(sim_nodes):
    with pytest.raises(DeployError, match="not a loopback http URL"):
        metrics_snapshot(sim_nodes.nodes[0], "http://10.0.0.1:8000/metrics; reboot")


def test_prometheus_text_is_parsed_per_sample_and_per_family():
    values = parse_metrics(METRICS)
    assert values['vllm:prompt_tokens_total{engine="1",model_name="qwen"}'] == 30000.0
    assert values["vllm:prefix_cache_hits_total"] == 1024.0


def test_a_file_that_changed_since_it_was_collected_is_named_not_replaced(sim_nodes):
    node, root = sim_nodes.nodes[0], sim_nodes.servers[0].root
    (root / "a.jsonl").write_text("{}\n")
    (root / "b.jsonl").write_text("{}\n")
    first = collect(sim_nodes.job, None, node, ["~/a.jsonl"])
    (root / "a.jsonl").write_text("{}\n{}\n")
    with pytest.raises(DeployError, match="a.jsonl: .*already stored for this job"):
        collect(sim_nodes.job, None, node, ["~/a.jsonl", "~/b.jsonl"])
    assert read_artifact(first[0]) == b"{}\n"
    assert sim_nodes.job.artifacts.filter(name="node1/b.jsonl").exists()
