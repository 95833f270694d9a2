"""G2 end to end on two simulated nodes: cold recovery on fx, output-equivalence probes on fx and recompute."""
from __future__ import annotations

from collections import Counter

import pytest

from runners.orchestration import start_gate_run, wait_for
from tests.orchestration.conftest import FAST_RUN, open_gate
from tests.orchestration.test_gate_runs import assert_judged, records_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_whole_g2_run_probes_outputs_on_fx_and_recompute_and_keeps_lmcache_retrievals(cluster, sim_site):
    cluster.worker("all", [cluster.control, sim_site.site.queue], concurrency=3)
    open_gate(sim_site.pilot, 2, sim_site.people)
    job = start_gate_run(sim_site.pilot.gate(2), sim_site.people.alice, site=sim_site.site,
                         params={**FAST_RUN, "repetitions": 1})
    job = wait_for(job, 300)
    assert_judged(job, cluster)
    phases = Counter((r["arm"], r["phase"]) for r in records_of(job))
    assert phases[("fx", "probe")] == phases[("recompute", "probe")] == 4
    assert job.artifacts.filter(kind="retrieve").exists()
