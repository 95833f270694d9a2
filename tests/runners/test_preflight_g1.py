"""A node that cannot run the gate ends G1 as `error` with every blocker, through real workers over real SSH."""
from __future__ import annotations

import pytest

from gates.models import Evaluation, Gate
from runners.models import Job, Node, Status
from runners.orchestration import start_gate_run, wait_for
from tests.orchestration.conftest import FAST_RUN, cluster, fast_settings, sim_site  # noqa: F401
from tests.runners.conftest import set_faults

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_g1_on_a_node_without_its_tools_ends_as_an_error_listing_them(cluster, sim_site):  # noqa: F811
    set_faults(sim_site.servers[1], missing_tools=["amd-smi", "rocm-smi", "fio", "vllm"])
    cluster.worker("all", [cluster.control, sim_site.site.queue], concurrency=3)
    job = wait_for(start_gate_run(sim_site.pilot.gate(1), params=FAST_RUN), timeout=600)
    text = "".join(job.chunks.values_list("text", flat=True))
    assert job.status == Status.ERROR, f"{job.status}: {job.error}\n{text[-4000:]}"
    assert "node2 cannot run the gate (3 blockers)" in job.error
    for message in ("`amd-smi` is not installed on node2: install ROCm's amd-smi",
                    "`fio` is not installed on node2: install fio",
                    "vLLM (`vllm`) is not found on node2: install it or set how it is launched"):
        assert message in job.error
    assert not job.steps.filter(name="deploy", started__isnull=False).exists()  # nothing was deployed
    assert not Evaluation.objects.filter(job=job).exists()  # infrastructure trouble is no verdict
    assert Gate.objects.get(pk=job.gate_id).verdict in ("", None)
    assert Node.objects.get(pk=sim_site.nodes[1].pk).inventory["preflight"]["ok"] is False
    assert Node.objects.get(pk=sim_site.nodes[0].pk).inventory["preflight"]["ok"] is True
    assert Job.objects.filter(pk=job.pk, status=Status.ERROR).exists()
