"""G2 and G4 end to end on two simulated nodes: output equivalence; replay, sharing, soak and the fault window."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from runners import traces
from runners.artifacts import read_artifact
from runners.orchestration import start_gate_run, wait_for
from runners.runs import sample_trace
from tests.orchestration.conftest import FAST_RUN, open_gate
from tests.orchestration.test_gate_runs import assert_judged, explain, records_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_whole_g2_run_probes_outputs_on_fx_and_recompute_and_keeps_lmcache_retrievals(cluster, sim_site):
    cluster.worker("all", [cluster.control, sim_site.site.queue], concurrency=3)
    open_gate(sim_site.pilot, 2, sim_site.people)
    job = start_gate_run(sim_site.pilot.gate(2), sim_site.people.alice, site=sim_site.site,
                         params={**FAST_RUN, "repetitions": 1})
    job = wait_for(job, 600)
    assert_judged(job, cluster)
    phases = Counter((r["arm"], r["phase"]) for r in records_of(job))
    assert phases[("fx", "probe")] == phases[("recompute", "probe")] == 4
    assert job.artifacts.filter(kind="retrieve").exists()


def test_a_whole_g4_run_replays_shares_across_nodes_soaks_and_cuts_the_fx_path(cluster, sim_site):
    cluster.worker("all", [cluster.control, sim_site.site.queue], concurrency=3)
    open_gate(sim_site.pilot, 4, sim_site.people)
    # the soak open loop at a rate the run sets (a pilot's is planned from G3's fx throughput, which this run lacks)
    params = {**FAST_RUN, "repetitions": 1, "soak_seconds": 4, "soak_min_requests": 40, "soak_rate": 12, "workloads": {
        **FAST_RUN["workloads"], "replay": {"max_sessions": 8}, "share": {"sessions": 8, "prompt_tokens": 4096},
        "soak": {"windows": 2, "concurrency": 4}}}
    # The customer's trace is uploaded through the G4 page's path (its content: the generator's, for speed).
    traces.upload(sim_site.pilot.gate(4), sample_trace(), "ours.csv", sim_site.people.bob, "customer")
    job = start_gate_run(sim_site.pilot.gate(4), sim_site.people.alice, site=sim_site.site, params=params)
    job = wait_for(job, 600)
    # Everything up to the judge ran; the verdict itself is the judge's business (see its own tests).
    before_judge = job.steps.exclude(name__in=("evaluate", "report"))
    assert set(before_judge.values_list("status", flat=True)) == {"successful"}, explain(job, cluster)
    rows = records_of(job)
    phases = Counter((r["arm"], r["phase"]) for r in rows)
    assert {("fx", "replay"), ("recompute", "replay"), ("fx", "share"), ("fx", "soak"), ("fx", "fault"),
            ("fx", "recovery")} <= set(phases)
    # the soak's floor reached the node's command line, and the soak did not end short of it
    soak = job.steps.get(name="soak")
    assert soak.params["min_requests"] == 40 and soak.params["rate"] == 12
    planned = json.loads(read_artifact(job.artifacts.get(kind="soak-rate")))
    assert planned["open_loop"] and planned["source"]["kind"] == "run-parameter", planned
    soaked = [r for r in rows if r["phase"] == "soak"]
    ok = sum(1 for r in soaked if r["status"] == "ok")
    summary = max((s for a in job.artifacts.filter(kind="phase-summary") for s in map(json.loads, read_artifact(a)
                   .decode().splitlines()) if s.get("phase") == "soak"), key=lambda s: s["repetition"])  # the last window
    assert summary["min_requests"] == 40 and summary["open_loop"] and summary["rate_per_s"] == 12, summary
    if ok < 40:  # a machine too busy to send 40 in 4 s: the soak sent on for its length again and says so
        assert 0 <= summary["extended_with_ok"] < 40, summary
        assert max(r["t_send"] for r in soaked) - min(r["t_send"] for r in soaked) > 4 + 3, "the soak stopped short"
    shared = {r["instance"] for r in rows if r["phase"] == "share"}
    assert len(shared) == 1 and shared != {r["instance"] for r in rows if r["phase"] == "replay" and r["arm"] == "fx"}
    assert job.artifacts.filter(name="customer-trace.csv").exists()
    assert job.steps.get(name="evaluate").status in ("successful", "failed", "error")
    # the path was really cut (through the simulated sudo) and restored, and recovery is judged on /metrics
    from gates.models import Evaluation

    verdict = Evaluation.objects.filter(job=job).latest("pk").result
    checks = {c["name"]: c for c in verdict["validity"]["checks"]}
    for name in ("fault-path-cut-confirmed", "external-hits-measured", "no-simulated-mixed-with-real"):
        assert checks[name]["ok"], checks[name]
    recovery = next(c for c in verdict["criteria"] if c["key"] == "g4-fault-recovery")
    assert recovery["metric"] == "external_hit_ratio" and recovery["cells"][0]["windows"] == 1, recovery
    assert recovery["cells"][0]["verdict"] == "pass", recovery  # the tier serves again once the path is back
    # what the G4 report states of the replay: the reuse reached against the replayed requests' own oracle, by stratum
    from reports.context import replay_fidelity

    fidelity = replay_fidelity(job)
    assert fidelity and fidelity["oracle"]["ideal_hit_tokens"] > 0, fidelity
    fx = next(c for c in fidelity["checks"] if c["arm"] == "fx")
    assert fx["reached"] and fx["reached"] > 0.5, fx
    assert set(fidelity["strata"]["strata"]) >= {"first", "returning"}, fidelity["strata"]
    # the capacity check at pilot scale: the sample once more on an fx server capped below what its reuse asks for
    assert ("fx", "capacity") in phases and job.steps.filter(name="capacity", status="successful").exists()
    capped = job.artifacts.filter(kind="config", name__contains="/fx-").order_by("pk").last()
    assert "capacity check: the disk tier capped at" in read_artifact(capped).decode()
    assert checks["replay-reached-trace-reuse"]["ok"] and checks["capacity-check-measured"]["ok"], checks
    check = next(c for c in verdict["criteria"] if c["key"] == "g4-capacity-check")
    cell = check["cells"][0]
    assert cell["applicable"] and cell["measured"] is not None, check
    assert abs(cell["difference"]) <= 0.05, check["explanation"]     # within 5 points of the oracle at the cap
    assert check["verdict"] in ("pass", "invalid"), check           # invalid only when another check failed
    speedup = next(c for c in verdict["criteria"] if c["key"] == "g4-replay-speedup")
    assert speedup["cells"][0]["strata"] == ["shared_prefix", "returning"], speedup
    print([c for c in verdict["validity"]["checks"] if not c["ok"]], check["explanation"], speedup["explanation"],
          next(c for c in verdict["criteria"] if c["key"] == "g4-replay-goodput")["explanation"], sep="\n")
