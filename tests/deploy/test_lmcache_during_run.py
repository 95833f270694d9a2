"""LMCache that stops working while the run goes on: vLLM keeps serving (every request recomputes), so the
records would all say `ok`. The runner reads the server log during each workload step and at collect; a line
showing LMCache degraded, failing to initialise or losing a connection ends the step in `error` naming that
line, and everything the node recorded is kept. On a simulated node whose LMCache's health monitor gives up
after a few requests (fault lmcache_degraded_after_requests), writing the line the way LMCache 0.5.x does."""
from __future__ import annotations

import shlex
import time

import pytest

from runners import detached, ssh
from runners.collect import collect_deployment
from runners.deploy import deploy_arm
from runners.deployment import DeployError
from runners.kinds import StepContext, StepError
from runners.lmcache import lmcache_trouble
from runners.models import Job, Status, Step
from runners.simnode.state import update_state
from runners.steps import poll_workload
from runners.teardown import teardown_arm

DEGRADED = "HealthMonitor: System unhealthy, entering degraded mode"
TOKEN = "test#1"


def _faults(server, **faults) -> None:
    update_state(server.root, lambda state: state["faults"].update(faults))


def _workload(deployment, name: str, requests_per_client: int) -> str:
    args = ["python3", deployment.workload, "cold-recovery", "--url", deployment.url, "--arm", deployment.arm,
            "--out", f"{deployment.records_dir}/{name}.jsonl", "--run-id", deployment.run_id,
            "--instance", deployment.instance, "--prompt-tokens", "2048", "--turn-tokens", "64", "--output-tokens", "4",
            "-c", "2", "--repetitions", "1", "--requests-per-client", str(requests_per_client), "--evict", "reset",
            "--quiet"]
    return "exec " + " ".join(shlex.quote(a) for a in args)


def _step(job, seq: int, name: str, node, arm: str, **fields) -> Step:
    return Step.objects.create(job=job, seq=seq, name=name, node=node, arm=arm, status=Status.RUNNING, claimed_by=TOKEN,
                               **fields)


def test_a_workload_step_whose_lmcache_goes_degraded_ends_in_error_naming_the_line(sim_nodes):
    """A local_nvme arm on node1 whose LMCache goes degraded after its 4th request."""
    job, node, server = sim_nodes.job, sim_nodes.nodes[0], sim_nodes.servers[0]
    _faults(server, lmcache_degraded_after_requests=4)
    deploy = _step(job, 1, "deploy", node, "local_nvme")
    deployment = deploy_arm(job, deploy, node, "local_nvme", time_scale=0.0005)
    try:
        _degrades(job, node, deploy, deployment)
    finally:
        teardown_arm(job, deploy, node, deployment)


def _degrades(job, node, deploy, deployment) -> None:
    with ssh.connect(node) as conn:
        assert lmcache_trouble(conn, deployment) is None          # healthy at the start
        proc = detached.start(conn, f"{deployment.arm_dir}/steps/02-measure", _workload(deployment, "02-measure", 8))
    measure = _step(job, 2, "measure", node, "local_nvme", params={"deploy": 1}, remote=proc.to_dict())
    deadline = time.monotonic() + 600
    with pytest.raises(StepError) as caught:
        while time.monotonic() < deadline:
            found = poll_workload(StepContext(measure, TOKEN))
            assert found.running, f"the workload ended (exit {found.exit_code}) and no poll saw LMCache degraded"
            time.sleep(0.2)
    message = str(caught.value)
    assert DEGRADED in message and "LMCache stopped working" in message and node.name in message
    assert "\x1b[" not in message                                   # the line without LMCache's colour codes
    assert not detached.poll(node, measure.remote, max_bytes=0).running  # the workload was stopped
    # how far the log was read is kept with the deployment, for the next step and for collect
    deploy.refresh_from_db()
    assert set(deploy.result["deployment"]["log_checked"]) == set(detached.RemoteProcess.from_dict(
        deployment.server).to_dict()[key] for key in ("stdout", "stderr"))

    # The run ends in error; its teardown keeps what the node recorded before the workload was stopped.
    Job.objects.filter(pk=job.pk).update(error=message)
    teardown_arm(job, deploy, node, deployment)
    kept = job.artifacts.filter(kind="records", outcome="error", name__endswith="02-measure.jsonl")
    assert kept.exists(), list(job.artifacts.values_list("name", "outcome"))
    assert job.artifacts.filter(kind="server-log").exists()

    # Had no poll looked (the line came after the last one), collect would read it: the files are kept first.
    deployment.log_checked = {}
    with pytest.raises(DeployError) as caught:
        collect_deployment(job, None, node, deployment)
    assert DEGRADED in str(caught.value) and "file(s) collected are kept but not judged" in str(caught.value)
    assert job.artifacts.filter(kind="manifest").exists()


def _sim_line(message: str, level: str) -> str:
    """A line exactly as the simulated server prints it (colour codes and vLLM's worker prefix included)."""
    import contextlib
    import io

    from runners.sim.server import lmcache_log

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        lmcache_log(message, level=level, where="base.py:288:lmcache.v1.health_monitor.base", prefix="(Worker pid=7) ")
    return out.getvalue()


def test_each_line_is_read_once_and_whole_and_a_fault_step_passes_over_its_lines(sim_nodes):
    """Without a server: a stand-in process whose log this test writes, to follow the offsets line by line."""
    from runners.deployment import Deployment

    job, node, server = sim_nodes.job, sim_nodes.nodes[1], sim_nodes.servers[1]
    run = server.root / "fxpilot-runs" / "scan"
    with ssh.connect(node) as conn:
        stand_in = detached.start(conn, str(run / "server"), "exec sleep 120")
    workloads = []
    deployment = Deployment(run_id="scan", arm="local_nvme", node=node.name, deploy_id="abc123", run_dir=str(run),
                            arm_dir=str(run / "arm"), config_path=str(run / "arm" / "lmcache.yaml"),
                            server=stand_in.to_dict(), healthy=True)
    Step.objects.create(job=job, seq=1, name="deploy", node=node, arm="local_nvme", status=Status.SUCCESSFUL,
                        result={"deployment": deployment.to_dict()})
    log = run / "server" / "stdout"

    def poll(seq: int, name: str):
        step = Step.objects.filter(job=job, seq=seq).first()
        if step is None:  # each step its own stand-in workload process
            with ssh.connect(node) as conn:
                workloads.append(detached.start(conn, str(run / f"workload-{seq}"), "exec sleep 120"))
            step = _step(job, seq, name, node, "local_nvme", params={"deploy": 1}, remote=workloads[-1].to_dict())
        return poll_workload(StepContext(step, TOKEN))

    try:
        with log.open("a") as handle:
            handle.write(_sim_line("Storing KV cache for 2048 out of 2112 tokens", "INFO"))
            handle.write(_sim_line("Ping error: [Errno 111] Connection refused", "ERROR").rstrip("\n")[:40])
        assert poll(2, "measure").running                          # half a line is left for the next look
        with log.open("a") as handle:
            handle.write(_sim_line("Ping error: [Errno 111] Connection refused", "ERROR")[40:])
        with pytest.raises(StepError, match=r"the server log says: \(Worker pid=7\) \[.*\] LMCache ERROR: Ping error"):
            poll(2, "measure")

        with log.open("a") as handle:
            handle.write(_sim_line(DEGRADED, "WARNING"))
        assert poll(3, "fault").running                            # a fault step cuts the path on purpose
        assert poll(4, "measure").running                          # and its lines are not read again
        with log.open("a") as handle:
            handle.write(_sim_line(DEGRADED, "WARNING"))
        with pytest.raises(StepError, match="entering degraded mode"):
            poll(4, "measure")
    finally:
        with ssh.connect(node) as conn:
            for proc in (stand_in, *workloads):
                detached.cancel(conn, proc.to_dict(), grace_seconds=1)
