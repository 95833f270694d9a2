"""The steps a gate run takes on a node, driven the way the runner drives them, against the real engine."""
from __future__ import annotations

import concurrent.futures
import json
import shlex

from django.db import connection

from runners import ssh
from runners.collect import collect_deployment
from runners.deploy import deploy_arm
from runners.deployment import Deployment
from tests.real.conftest import PROMPT_TOKENS, WORKLOAD_S

ARMS = ("recompute", "local_nvme")

# Cold recovery at concurrency 2, twice (G2's judge wants two repetitions at least): 8 fresh sessions populated
# (the judge needs 8 requests per cell), the prefix cache reset, the same 8 prompts measured. The measure resends
# each context unchanged (--turn-tokens 0), so every hit is the stored prompt's whole chunks.
SESSIONS = 8
REPETITIONS = 2
COLD = ["--prompt-tokens", str(PROMPT_TOKENS), "--turn-tokens", "0", "--output-tokens", "4", "-c", "2",
        "--repetitions", str(REPETITIONS), "--requests-per-client", str(SESSIONS // 2), "--evict", "reset",
        "--timeout", "300"]
# G2's output equivalence: the same 8 probe prompts on both arms at temperature 0 (warm, reset, probe).
PROBE = ["--prompts", "8", "--prompt-tokens", str(PROMPT_TOKENS), "--output-tokens", "8", "-c", "2", "--evict",
         "reset", "--timeout", "300"]


def start_both_arms(action) -> dict[str, concurrent.futures.Future]:
    """action(arm) on both arms at once (each server has its own port and directory), each in a thread with its own
    database connection, closed when it is done. Start it with the database unblocked (the site's blocker) and
    outside any transaction: on SQLite a transaction of the calling thread holds the write lock (BEGIN IMMEDIATE)
    until it ends, and every write of the arms (their live log, the server logs kept at teardown) fails with
    "database is locked" after waiting 30 s for it. A test's own transaction is one: run both arms in a fixture
    (set up before it begins), as real_servers, runs and torn_down do."""
    if connection.in_atomic_block:
        raise RuntimeError("both arms at once inside a transaction (a test's own?): on SQLite it holds the write lock "
                           "their writes would wait for; run them in a fixture")

    def one(arm: str):
        try:
            return action(arm)
        finally:
            connection.close()

    pool = concurrent.futures.ThreadPoolExecutor(len(ARMS))
    futures = {arm: pool.submit(one, arm) for arm in ARMS}
    pool.shutdown(wait=False)
    return futures


def both_arms(site, action) -> dict:
    """action(arm) on both arms at once (start_both_arms); their results, once both are done."""
    with site.blocker.unblock():
        futures = start_both_arms(action)
        concurrent.futures.wait(futures.values())
        return {arm: future.result() for arm, future in futures.items()}


def deploy(site, arm: str) -> Deployment:
    return deploy_arm(site.jobs[arm], None, site.node, arm)


def versions(conn: ssh.NodeConnection, deployment: Deployment) -> dict:
    manifest = json.loads(conn.run(f"cat {ssh.shell_path(deployment.arm_dir + '/manifest.json')}", echo=False).stdout)
    found = manifest["versions"]
    return {"vllm": found["vllm"], "lmcache": found["lmcache"]["version"], "lmcache_commit": found["lmcache"]["commit"],
            "kv_connector": manifest["kv_connector"], "page_cache": manifest["page_cache"],
            "chunk_hash": manifest["chunk_hash"], "lmcache_fingerprint": found.get("lmcache_fingerprint"),
            "none_hash": found.get("none_hash"), "model": manifest["model"],
            **{key: found[key] for key in ("kv_bytes_per_token", "kv_cache_dtype") if found.get(key)}}


def server_log(site, deployment: Deployment) -> str:
    """LMCache's lines (and any about the hash seed) of what the server has written so far, stdout and stderr."""
    paths = " ".join(ssh.shell_path(deployment.server[key]) for key in ("stdout", "stderr") if deployment.server.get(key))
    with ssh.connect(site.node) as conn:
        return conn.run(f"grep -a -h -e LMCache -e PYTHONHASHSEED -- {paths} || true", echo=False, timeout=600).stdout


def tier_flags(deployment: Deployment) -> list[str]:
    """What the runner gives the workload client for a cache arm: LMCache's internal API servers (every eviction
    empties their DRAM tier after vLLM's prefix-cache reset) and the disk tier's block device (its read counter
    sampled with every /metrics scrape)."""
    flags = [word for url in deployment.lmcache_api_urls for word in ("--lmcache-api", url)]
    if deployment.disk_device:
        flags += ["--disk-device", deployment.disk_device]
    return flags


def cold_recovery(site, deployment: Deployment, *extra: str) -> str:
    """The shipped workload client, run on the node with the node's python3; returns its stdout."""
    return workload(site, deployment, "cold-recovery", "cold.jsonl", *COLD, *tier_flags(deployment), *extra)


def probe(site, deployment: Deployment) -> str:
    return workload(site, deployment, "probe", "probe.jsonl", *PROBE, *tier_flags(deployment))


def workload(site, deployment: Deployment, command: str, out: str, *flags: str) -> str:
    with ssh.connect(site.node) as conn:
        args = [command, "--url", deployment.url, "--arm", deployment.arm, "--out",
                f"{deployment.records_dir}/{out}", "--run-id", deployment.run_id, "--instance",
                deployment.instance, "--simulated", "no", "--versions", json.dumps(versions(conn, deployment)), *flags]
        command = f"python3 {ssh.shell_path(deployment.workload)} " + " ".join(shlex.quote(a) for a in args)
        return conn.run(command, job=site.jobs[deployment.arm], timeout=WORKLOAD_S).stdout


def collect(site, deployment: Deployment) -> dict[str, bytes]:
    from runners.artifacts import read_artifact

    return {a.name: read_artifact(a) for a in collect_deployment(site.jobs[deployment.arm], None, site.node, deployment)}
