"""The production layout on one machine: the web tier and the customer's network apart (Linux network namespaces).

The web tier — this test process (the portal and the agent API, served by the live server), PostgreSQL, Redis,
SeaweedFS and the control worker, which also serves the site's queue — stays in the machine's own network. A
namespace is the customer's network: the simulated GPU nodes and the **site agent** live there, and the web tier's
data folder is covered by an empty file system in their view. The one link between the two carries the agent's
HTTPS-style calls to the agent API and nothing else: no database, no broker, no object store is reachable from the
customer's network, and the agent holds only its own three variables. The site's SSH key is sealed to the agent's
key: the control plane cannot open it, and the agent cannot open another site's. A whole G1 → G2 → G3 completes
through the agent, across a 40 s cut of the link and a control worker killed and started again, with every record
collected once; every artifact and report is in the object store, and the reports read back from it verify.

The namespace, its relay and the store are made once for the module and removed at its end, with every process
still living in the namespace, whatever the outcome.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import paramiko
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from gates import lifecycle
from gates.models import Gate, Report
from infra.lifetime import watched_environment
from runners import sealing, ssh
from runners.agents import create_agent
from runners.artifacts import read_artifact
from runners.credentials import create_credential
from runners.models import AgentCall, Node, Site, Status, active_agent
from runners.orchestration import start_gate_run, wait_for
from tests.orchestration.conftest import FAST_RUN, ROOT, Worker, purge
from tests.orchestration.test_gate_runs import explain
from tests.storage.seaweed import SeaweedFS
from tests.topology.netns import CustomerNetwork, available

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=str(available())),
              pytest.mark.skipif(connection.vendor != "postgresql" or not django_settings.CELERY_BROKER_URL.startswith("redis"),
                                 reason="the control worker shares PostgreSQL and Redis with this process")]

# The shortest runs the judge accepts: two repetitions where its intervals need a spread (G1, G3), one for G2. G3
# is judged (it has a report) only when its "failed ≤ 1 %" bar can be shown, which takes 390 error-free FX requests
# (8 repetitions here, two thirds of the test's time): the module's plan loosens that bar to G3_FAILURE_BAR, which
# the 112 requests of two repetitions show (_plan_for_the_network_proof).
RUNS = {1: FAST_RUN, 2: {**FAST_RUN, "repetitions": 1}, 3: {**FAST_RUN, "repetitions": 2}}
G3_FAILURE_BAR = 0.10
# longer than the control plane waits for the agent to take or touch a call (30 s: FXPILOT_AGENT_PICKUP_SECONDS,
# FXPILOT_AGENT_SILENCE_SECONDS), and than the agent's back-off reaches its 15 s cap in (1 + 2 + 4 + 8 + 15 s)
CUT_SECONDS = 40
# What the test waits for: the agent enrolling, the simulated nodes starting, per gate a remote process starting (G2
# and G3) then the run ending. Each wait's bound is a hang bound (HANG_S: only a hang reaches it, and it says what it
# waited for); none says how fast the machine must be. The three runs took 250 s on a quiet 2-core machine and
# 550–583 s at load 7–17 (benchmarks/ci/README.md), where pytest.ini's old 600 s limit killed it mid-run: its pytest
# limit is one hang bound above three times that.
HANG_S = 600
RUN_WAIT_S = HANG_S
TEST_TIMEOUT_S = 3 * 600 + HANG_S


def _until(condition, timeout: float, why) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"hung ({timeout:g} s): {why()}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=600)


@pytest.fixture(scope="module")
def two_networks(tmp_path_factory):
    """The customer network and the S3 store (in the web tier), for the whole module."""
    base = tmp_path_factory.mktemp("topology")
    net = CustomerNetwork()
    store = None
    with net:
        try:
            store = SeaweedFS(base / "s3", host="127.0.0.1").start()
            yield SimpleNamespace(net=net, store=store)
        finally:
            if store is not None:
                store.stop()
    # Nothing of the test outlives it: the namespace is gone with every process that lived in it.
    assert not net.exists() and not net.pids(), f"{net.name} left behind: {net.pids()}"


def _reachable_from(net: CustomerNetwork, host: str, port: int) -> bool:
    probe = (f"import socket,sys\ntry: socket.create_connection(({host!r}, {port}), timeout=3)\n"
             "except OSError: sys.exit(1)")
    return net.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def _api(base: str, token: str, method: str, path: str, body: dict | None = None) -> int:
    request = urllib.request.Request(base + path, method=method, data=json.dumps(body or {}).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code


def _simulated_nodes(net: CustomerNetwork, root: Path, hide: list[str], env: dict, log: Path) -> subprocess.Popen:
    """The simulated nodes inside the customer network, with no database: the web tier registers them below."""
    argv = [sys.executable, "manage.py", "simnode", "--nodes", "2", "--dir", str(root), "--time-scale",
            str(FAST_RUN["time_scale"])]
    return subprocess.Popen(net.argv(argv, hide=hide), cwd=ROOT, env=env, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _register(site: Site, root: Path, log: Path) -> list[Node]:
    """What an engineer does in the portal: upload the site's key (sealed to its agent at once) and add the nodes
    with the host keys read off the nodes themselves (the simulator's key files)."""
    lines = [line.split() for line in log.read_text().splitlines() if line.startswith("node") and " port=" in line]
    credential = create_credential(site, "customer key", (root / "client_key").read_text())
    nodes = []
    for fields in lines:
        values = dict(field.split("=", 1) for field in fields[1:] if "=" in field)
        host_key = paramiko.Ed25519Key.from_private_key_file(str(root / f"{fields[0]}.host_key"))
        node = Node.objects.create(site=site, name=fields[0], host="127.0.0.1", port=int(values["port"]),
                                   username=values["user"], credential=credential, simulated=True,
                                   pending_host_key_type=host_key.get_name(), pending_host_key=host_key.get_base64(),
                                   pending_host_key_fingerprint=host_key.fingerprint)
        nodes.append(ssh.accept_host_key(node, host_key.fingerprint))
    return nodes


def _when_a_remote_process_runs(job, timeout: float = HANG_S) -> None:
    _until(lambda: job.steps.filter(status=Status.RUNNING).exclude(remote={}).exists()
           or job.__class__.objects.get(pk=job.pk).is_finished, timeout, lambda: f"run {job.code} started nothing")


def _plan_for_the_network_proof(demo) -> None:
    """G1's and G2's bars opened wide before both parties sign, so the lifecycle reaches G3 whatever the
    simulator's spread at this time scale: this module proves where things run and are stored, not the bars.
    G3 keeps the plan's own bars, and may be judged either way, but for its failure rate: G3_FAILURE_BAR."""
    version = demo.pilot.latest_plan
    for criterion in version.criteria.filter(gate_number__in=(1, 2)):
        if criterion.op in (">=", ">"):
            lifecycle.edit_criterion(criterion, demo.alice, op=">=", threshold=-1e9)
        elif criterion.op in ("<=", "<"):
            lifecycle.edit_criterion(criterion, demo.alice, op="<=", threshold=1e9)
    lifecycle.edit_criterion(version.criteria.get(key="g3-failures"), demo.alice, op="<=", threshold=G3_FAILURE_BAR)
    lifecycle.sign_plan(version, demo.alice)
    lifecycle.sign_plan(version, demo.bob)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_g1_to_g3_through_the_site_agent_on_two_networks(two_networks, cluster, demo, settings, tmp_path,
                                                        live_server):
    net, store = two_networks.net, two_networks.store
    web_data = str(Path(django_settings.DATA_DIR).resolve())
    settings.STORAGES = {**settings.STORAGES, "evidence": store.evidence_storage}
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, net.web_address]  # the address the agent reaches the API at
    _plan_for_the_network_proof(demo)
    pilot = demo.pilot
    started: list = []
    try:
        site = Site.objects.create(pilot=pilot, name="customer network", queue=f"site-cust-{uuid.uuid4().hex[:6]}")
        purge([cluster.control, site.queue])
        # Another customer's site, whose agent enrolled elsewhere: its key sealed to that agent's key.
        other_private, other_public = sealing.new_keypair()
        other = Site.objects.create(pilot=pilot, name="another customer", queue=f"site-other-{uuid.uuid4().hex[:6]}")
        other_agent, _ = create_agent(other)
        other_agent.public_key = other_public
        other_agent.save(update_fields=["public_key"])
        other_key = create_credential(other, "their key", paramiko_key_text())
        other_node = Node.objects.create(site=other, name="their-node", host="127.0.0.1", port=22, username="x",
                                         credential=other_key)
        other_call = AgentCall.objects.create(site=other, node=other_node, op="run", request={"command": "true"},
                                              deadline=timezone.now() + timedelta(hours=1))

        # The site agent: its token, the portal's address as the customer network sees it, a state folder.
        agent, token = create_agent(site)
        api = f"http://{net.web_address}:{net.forward(urlsplit(live_server.url).port)}"
        state = tmp_path / "agent-state"
        # Both environments are built from scratch: each carries the session's mark (watched_environment), so a
        # pytest killed before its teardown still has the agent and the nodes ended by its watcher.
        agent_env = {**watched_environment(), "PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "FXPILOT_AGENT_URL": api,
                     "FXPILOT_AGENT_TOKEN": token, "FXPILOT_AGENT_STATE": str(state)}
        agent_log = tmp_path / "agent.log"
        agent_proc = subprocess.Popen(net.argv([sys.executable, "-m", "runners.agent"], hide=[web_data]), cwd=ROOT,
                                      env=agent_env, stdout=open(agent_log, "ab"), stderr=subprocess.STDOUT,
                                      start_new_session=True)
        started.append(agent_proc)
        agent_text = lambda: agent_log.read_text(errors="replace")[-3000:]  # noqa: E731
        _until(lambda: active_agent(site) is not None or agent_proc.poll() is not None, HANG_S, agent_text)
        assert agent_proc.poll() is None, agent_text()

        nodes_dir, sim_log = tmp_path / "nodes", tmp_path / "simnode.log"
        sim_env = {**watched_environment(), "PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT),
                   "FXPILOT_DATA_DIR": str(tmp_path / "sim-data")}
        simnode = _simulated_nodes(net, nodes_dir, [web_data], sim_env, sim_log)
        started.append(simnode)
        control = Worker("control", [cluster.control, site.queue],
                         {**cluster.environment, **store.env, "SECRET_KEY": django_settings.SECRET_KEY}, tmp_path,
                         concurrency=3).start()
        started.append(control)
        started.append(cluster.reconciler())
        _until(lambda: "running; Ctrl-C" in sim_log.read_text(errors="replace") or simnode.poll() is not None, HANG_S,
               lambda: sim_log.read_text(errors="replace")[-3000:])
        nodes = _register(site, nodes_dir, sim_log)
        assert len(nodes) == 2, sim_log.read_text(errors="replace")[-3000:]

        # What the customer network can reach of the web tier: the agent API, nothing else.
        db = connection.settings_dict
        broker = urlsplit(django_settings.CELERY_BROKER_URL)
        for name, port in (("PostgreSQL", int(db["PORT"] or 5432)), ("Redis", broker.port or 6379),
                           ("the object store", urlsplit(store.env["FXPILOT_S3_ENDPOINT_URL"]).port)):
            assert not _reachable_from(net, net.web_address, port), f"{name} is reachable from the customer network"
        # The control plane cannot open the site's key, and the agent's key opens its own site's key only.
        for node in nodes:
            with pytest.raises(ssh.InvalidNodeSettings, match="sealed"):
                ssh.NodeConnection(node).open()
        key_file = state / "agent.key"
        mine = nodes[0].credential
        assert mine.sealed_key and not mine.private_key_encrypted
        assert b"PRIVATE KEY" in sealing.open_sealed(key_file.read_text().strip(), mine.sealed_key)
        with pytest.raises(sealing.SealError):
            sealing.open_sealed(key_file.read_text().strip(), other_key.sealed_key)
        # With the agent's token, another site's call cannot be fetched or answered.
        base = live_server.url
        for method, path in (("POST", f"/agent/v1/calls/{other_call.pk}/output"),
                             ("POST", f"/agent/v1/calls/{other_call.pk}/done"),
                             ("GET", f"/agent/v1/calls/{other_call.pk}/payload"),
                             ("PUT", f"/agent/v1/calls/{other_call.pk}/file")):
            assert _api(base, token, method, path, {} if method != "GET" else None) == 404, (method, path)
        seen = net.run(["unshare", "--mount", "--", "sh", "-c",
                        f"mount -t tmpfs -o size=1m,mode=000 hidden {web_data} && ls -A {web_data}"],
                       capture_output=True, text=True)
        assert seen.returncode == 0 and seen.stdout == "", seen.stderr

        logs = lambda: agent_text() + "\n" + "\n".join(w.text()[-3000:] for w in started if isinstance(w, Worker))  # noqa: E731

        before = {path for path in Path(web_data).rglob("*")}
        jobs = []
        for number in (1, 2, 3):
            gate = pilot.gate(number)
            began = time.monotonic()
            job = start_gate_run(gate, demo.alice, site=site, params=RUNS[number])
            if number == 2:
                # The link between the customer network and the web tier goes down for CUT_SECONDS while the
                # workload runs on the nodes; the agent reports what it did once the link is back.
                _when_a_remote_process_runs(job)
                subprocess.run(["ip", "link", "set", net.web_if, "down"], check=True)
                try:
                    time.sleep(CUT_SECONDS)
                finally:
                    subprocess.run(["ip", "link", "set", net.web_if, "up"], check=True)
            if number == 3:
                # The control worker dies while it follows the nodes; a new one takes over (the sweep resumes).
                _when_a_remote_process_runs(job)
                control.kill()
                control.start()
            job = wait_for(job, RUN_WAIT_S)
            print(f"G{number} run {job.status} in {time.monotonic() - began:.1f} s")  # noqa: T201 — durations, with -rP
            jobs.append(job)
            gate.refresh_from_db()
            if number < 3:
                assert job.status == Status.SUCCESSFUL and gate.state == Gate.State.AWAITING_SIGNOFF, \
                    explain(job, cluster) + logs()
                lifecycle.sign_off_gate(gate, demo.bob, decision="approve")
                lifecycle.sign_off_gate(gate, demo.alice, decision="approve")
            else:
                assert job.status in (Status.SUCCESSFUL, Status.FAILED), explain(job, cluster) + logs()

        # The agent saw the cut (its calls could not reach the control plane) and carried on once the link was back.
        whole = agent_log.read_text(errors="replace")
        assert "cannot be reached" in whole, agent_text()
        keys = set(store.keys())
        artifacts = [a for job in jobs for a in job.artifacts.all()]
        names = [(a.job.gate.number, a.name) for a in artifacts if a.outcome != "superseded"]
        assert len(names) == len(set(names)), "a record was collected twice"
        assert {(1, "node1/inventory.json"), (1, "node2/inventory.json")} <= set(names)
        assert {2, 3} <= {number for number, name in names if name.endswith(".jsonl")}, sorted(names)
        assert all(a.storage_name in keys for a in artifacts)
        assert not [a.name for a in artifacts if (Path(web_data) / a.storage_name).exists()
                    and Path(web_data) / a.storage_name not in before]
        assert all(read_artifact(a) is not None for a in artifacts)
        # Every node contact went through the agent, and the other site's call was never handed out.
        assert AgentCall.objects.filter(site=site, state="done").count() > 10
        other_call.refresh_from_db()
        assert other_call.state == "queued" and other_call.agent_id is None
        from reports.service import report_bytes, verify_report_bytes

        reports = list(Report.objects.filter(pilot=pilot))
        assert {r.gate.number for r in reports if r.gate_id} == {1, 2, 3}
        assert all(r.path in keys and verify_report_bytes(report_bytes(r)).ok for r in reports)
    finally:
        for proc in reversed(started):
            if isinstance(proc, subprocess.Popen):
                _stop(proc)
            elif proc.proc is not None:
                proc.stop()
        # What the simulated nodes detached (servers in sessions of their own) is the namespace's to end.
        net.kill_everything_inside()


def paramiko_key_text() -> str:
    """A fresh Ed25519 private key in the OpenSSH format (another customer's)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()).decode()
