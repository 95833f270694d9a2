"""An FX path lost mid-run for a reason outside the run: the collect is an `error`, never a verdict.

Another party unmounts the FX array (or unmounts it and mounts it again, so that it looks attached at the
end) between the deploy and the collect, on a simulated node over real SSH. The collect keeps what the node
recorded and refuses it for the judge; the collect step kind makes that a step `error`, which the evaluate
step of every gate (it needs every collect successful) never turns into a verdict.
"""
from __future__ import annotations

import shlex

import pytest

from runners import ssh
from runners.collect import collect_deployment, fx_path_intact
from runners.config import default_simulated
from runners.deploy import deploy_arm
from runners.deployment import DeployError
from runners.kinds import StepContext, StepError
from runners.models import Step
from runners.steps import run_collect
from runners.teardown import teardown_arm

OUTSIDE = {
    "unmounted": ("umount {mount}", "is no longer mounted"),
    "mounted again": ("umount {mount} && mount {device} {mount}", "was unmounted and mounted again while the run used it"),
}


@pytest.mark.parametrize("interference", sorted(OUTSIDE))
def test_an_fx_path_lost_to_another_party_is_an_error_at_collection_and_what_was_recorded_is_kept(sim_nodes,
                                                                                                   interference):
    job, node, server = sim_nodes.job, sim_nodes.nodes[0], sim_nodes.servers[0]
    sim_nodes.pilot.deployment = default_simulated()
    sim_nodes.pilot.save()
    deploy = Step.objects.create(job=job, seq=1, name="deploy", node=node, arm="fx")
    deployment = deploy_arm(job, deploy, node, "fx", time_scale=0.0005)
    deploy.result = {"deployment": deployment.to_dict()}
    deploy.save()
    collect = Step.objects.create(job=job, seq=2, name="collect", node=node, arm="fx", params={"deploy": 1})
    try:
        state = server.state()
        mount, device = state["fx"]["mounted_at"], state["fx"]["namespace"]
        with ssh.connect(node) as conn:
            assert fx_path_intact(conn, deployment) is None  # untouched, the path is the one attached
        records = f"{deployment.records_dir}/fx.jsonl"
        ssh.run(node, f"mkdir -p {shlex.quote(deployment.records_dir)} && echo '{{}}' > {shlex.quote(records)}")

        command, says = OUTSIDE[interference]
        ssh.run(node, command.format(mount=shlex.quote(mount), device=shlex.quote(device)))
        assert bool(server.state()["fx"]["mounted_at"]) == (interference == "mounted again")

        with pytest.raises(DeployError) as lost:
            collect_deployment(job, collect, node, deployment)
        assert says in str(lost.value) and "interference from outside this run" in str(lost.value), str(lost.value)
        assert job.artifacts.filter(name=f"{deployment.name_prefix}/records/fx.jsonl", kind="records").exists()
        # The step kind the engine runs: a StepError, which the engine records as `error` (never `failed`).
        with pytest.raises(StepError) as step_error:
            run_collect(StepContext(collect, "test"))
        assert says in str(step_error.value)
    finally:
        teardown_arm(job, deploy, node, deployment)
