"""vLLM's ExampleConnector checks the pipeline; it is never a pilot's cache arm on real nodes."""
from __future__ import annotations

import pytest

from runners.config import default_simulated
from runners.deploy import deploy_arm
from runners.deployment import DeployError
from runners.models import Job, Node

pytestmark = pytest.mark.django_db


def _node(site, credential, name: str, simulated: bool) -> Node:
    # port 9 on loopback: nothing answers, and nothing here is meant to connect
    return Node.objects.create(site=site, name=name, host="127.0.0.1", port=9, username="nobody",
                               credential=credential, simulated=simulated)


def test_the_example_connector_is_refused_on_a_pilot_with_real_nodes_before_anything_is_touched(pilot, site, credential):
    pilot.deployment = default_simulated() | {"kv_connector": "ExampleConnector"}
    pilot.save(update_fields=["deployment"])
    job = Job.objects.create(pilot=pilot, site=site, kind=Job.Kind.GATE_RUN)
    simulated = _node(site, credential, "sim1", True)
    _node(site, credential, "gpu01", False)
    # a simulated node of a pilot that also has a real one: refused too, naming the real node
    with pytest.raises(DeployError, match=r"node sim1: deployment.kv_connector is ExampleConnector, vLLM's reference "
                                          r"connector, not LMCache: a pilot with real nodes \(gpu01\) deploys "
                                          r"LMCacheConnectorV1"):
        deploy_arm(job, None, simulated, "fx")


def test_the_real_engine_test_tier_says_so_and_a_simulated_pilot_may_use_it(pilot, site, credential):
    from runners.deploy import refuse_test_connector
    from runners.deployment import settings_for

    job = Job.objects.create(pilot=pilot, site=site, kind=Job.Kind.GATE_RUN)
    real = _node(site, credential, "gpu01", False)
    pilot.deployment = default_simulated() | {"kv_connector": "ExampleConnector", "engine_test_tier": True}
    pilot.save(update_fields=["deployment"])
    refuse_test_connector(job, real, settings_for(job, real))  # the tier named itself: allowed
    real.delete()
    simulated = _node(site, credential, "sim1", True)
    pilot.deployment = default_simulated() | {"kv_connector": "ExampleConnector"}
    pilot.save(update_fields=["deployment"])
    refuse_test_connector(job, simulated, settings_for(job, simulated))  # every node simulated: allowed
