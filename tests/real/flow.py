"""The steps a gate run takes on a node, driven the way the runner drives them, against the real engine."""
from __future__ import annotations

import concurrent.futures
import json
import shlex

from django.db import connection

from runners import ssh
from runners.deploy import Deployment, collect_deployment, deploy_arm
from tests.real.conftest import PROMPT_TOKENS, WORKLOAD_S

ARMS = ("recompute", "local_nvme")

# Cold recovery at concurrency 2: 8 sessions populated (the judge needs 8 requests per cell), the prefix cache
# reset, the same 8 prompts measured.
# The measure resends each context unchanged (--turn-tokens 0): ExampleConnector matches whole prompts only.
SESSIONS = 8
COLD = ["--prompt-tokens", str(PROMPT_TOKENS), "--turn-tokens", "0", "--output-tokens", "4", "-c", "2",
        "--repetitions", "1", "--requests-per-client", str(SESSIONS // 2), "--evict", "reset", "--timeout", "300"]


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
            "kv_connector": manifest["kv_connector"], "page_cache": manifest["page_cache"]}


def cold_recovery(site, deployment: Deployment, *extra: str) -> str:
    """The shipped workload client, run on the node with the node's python3; returns its stdout."""
    with ssh.connect(site.node) as conn:
        args = ["cold-recovery", "--url", deployment.url, "--arm", deployment.arm, "--out",
                f"{deployment.records_dir}/cold.jsonl", "--run-id", deployment.run_id, "--instance",
                deployment.instance, "--simulated", "no", "--versions", json.dumps(versions(conn, deployment)),
                *COLD, *extra]
        command = f"python3 {ssh.shell_path(deployment.workload)} " + " ".join(shlex.quote(a) for a in args)
        return conn.run(command, job=site.jobs[deployment.arm], timeout=WORKLOAD_S).stdout


def collect(site, deployment: Deployment) -> dict[str, bytes]:
    from runners.artifacts import read_artifact

    return {a.name: read_artifact(a) for a in collect_deployment(site.jobs[deployment.arm], None, site.node, deployment)}
