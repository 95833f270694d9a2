"""G4's arms and the soak's planned rate, and the workload client's tier flags (no worker needed).

Issue 43/44/45's orchestration: every cold window empties LMCache's DRAM (--lmcache-api), every step of a disk-tier
arm samples its device (--disk-device); G4 replays the sample on every arm of the plan's G4 (fx first), the recompute
arm with vLLM's prefix caching on; the soak runs open loop at a share of what G3 measured for fx at its concurrency.
"""
from __future__ import annotations

import json

import pytest

from portal.management import demo_soak
from runners import gateplans, steps, traces
from runners.artifacts import store_bytes
from runners.deployment import Deployment
from runners.kinds import StepError
from runners.models import Job, Node, Site, Status
from runners.orchestration import start_gate_run
from runners.remote.workload import build_parser
from runners.runs import RunRefused, sample_trace, validate_params
from tests.orchestration.conftest import open_gate


@pytest.fixture
def site_of(demo):
    def make(count: int) -> Site:
        site = Site.objects.create(pilot=demo.pilot, name=f"site{count}", queue=f"q-site{count}")
        for i in range(1, count + 1):
            Node.objects.create(site=site, name=f"node{i}", host="127.0.0.1", username="fxpilot", simulated=True)
        return site
    return make


def _summary(arm: str, phase: str, concurrency: int, repetition: int, requests: int, errors: int, seconds: float) -> dict:
    return {"schema": "fxpilot.phase/1", "arm": arm, "phase": phase, "concurrency": concurrency,
            "repetition": repetition, "requests": requests, "errors": errors, "duration_s": seconds}


def _g3_run(pilot, rows: list[dict], status=Status.SUCCESSFUL) -> Job:
    job = Job.objects.create(pilot=pilot, gate=pilot.gate(3), status=status, params={"time_scale": 0.01})
    text = "".join(json.dumps(row) + "\n" for row in rows).encode()
    store_bytes(job, "node1/fx-abc/records/05-measure.summary.json", text, kind="phase-summary")
    return job


def test_the_soak_rate_is_a_share_of_the_fx_throughput_g3_measured_at_the_soaks_concurrency(signed_pilot, site_of):
    pilot = signed_pilot.pilot
    g3 = _g3_run(pilot, [_summary("fx", "measure", 16, 1, 16, 0, 2.0),      # 8 requests/s
                         _summary("fx", "measure", 16, 2, 16, 1, 1.5),      # 10
                         _summary("fx", "measure", 16, 3, 16, 0, 1.6),      # 10
                         _summary("fx", "measure", 8, 1, 8, 0, 0.1),        # another level: not the soak's
                         _summary("local_nvme", "measure", 16, 1, 16, 0, 0.1),
                         _summary("fx", "populate", 16, 1, 16, 0, 0.1)])
    open_gate(pilot, 4, signed_pilot)
    traces.upload(pilot.gate(4), sample_trace(), "ours.csv", signed_pilot.bob, "customer")
    job = start_gate_run(pilot.gate(4), signed_pilot.alice, site=site_of(2))
    soak = job.steps.get(name="soak")
    planned = soak.params["rate_plan"]
    assert planned["source"]["kind"] == "g3-throughput" and planned["source"]["job"] == str(g3.code)
    assert planned["source"]["per_second"] == pytest.approx(10.0) and planned["source"]["repetitions"] == 3
    assert planned["fraction"] == gateplans.SOAK_RATE_FRACTION and planned["concurrency"] == 16
    assert soak.params["rate"] == pytest.approx(gateplans.SOAK_RATE_FRACTION * 10.0)
    # on simulated nodes a rate planned from G3 keeps the soak's closed loop (runners.steps.soak_rate_args), so its
    # length is not raised to that rate's floor: the soak's own floor (min_requests) sends on instead
    assert "seconds_raised" not in planned and soak.params.get("min_requests")
    words = gateplans.soak_rate_source(planned)
    assert "70 % of the 10 requests/s the fx arm served at concurrency 16 in G3 run" in words


def test_without_g3_evidence_the_soak_says_why_it_has_no_rate_and_a_run_may_set_one(signed_pilot, site_of):
    pilot = signed_pilot.pilot
    open_gate(pilot, 4, signed_pilot)
    traces.upload(pilot.gate(4), sample_trace(), "ours.csv", signed_pilot.bob, "customer")
    job = start_gate_run(pilot.gate(4), signed_pilot.alice, site=site_of(1))
    soak = job.steps.get(name="soak")
    assert "rate" not in soak.params
    assert "G3 has no successful run" in soak.params["rate_plan"]["reason"]
    job.cancel_requested = True
    job.status = Status.CANCELED
    job.save()
    job = start_gate_run(pilot.gate(4), signed_pilot.alice, site=site_of(2), params={"soak_rate": 2.5})
    soak = job.steps.get(name="soak")
    assert soak.params["rate"] == 2.5 and soak.params["rate_plan"]["source"]["kind"] == "run-parameter"
    with pytest.raises(RunRefused, match="soak_rate"):
        validate_params({"soak_rate": 0})


def test_a_g3_run_that_did_not_measure_the_soaks_concurrency_is_named(signed_pilot):
    _g3_run(signed_pilot.pilot, [_summary("fx", "measure", 8, 1, 8, 0, 1.0)])
    found = gateplans.g3_throughput(signed_pilot.pilot, arm="fx", concurrency=16)
    assert found == {"reason": "no successful G3 run measured fx at concurrency 16 (the soak's concurrency)"}


@pytest.mark.parametrize("nodes", [1, 2])
def test_g4_replays_on_every_arm_of_its_plan_fx_first_and_recompute_with_prefix_caching(signed_pilot, site_of, nodes):
    pilot = signed_pilot.pilot
    open_gate(pilot, 4, signed_pilot)
    traces.upload(pilot.gate(4), sample_trace(), "ours.csv", signed_pilot.bob, "customer")
    job = start_gate_run(pilot.gate(4), signed_pilot.alice, site=site_of(nodes))
    ordered = list(job.steps.order_by("seq"))
    by_seq = {s.seq: s for s in ordered}
    replays = [(by_seq[s.params["deploy"]].arm, s.name) for s in ordered if s.name in ("replay", "capacity")]
    arms = gateplans.g4_arms(job)
    assert arms[0] == "fx" and replays[0] == ("fx", "replay") and ("fx", "capacity") in replays
    assert [arm for arm, name in replays if name == "replay"] == list(arms)
    for deploy in (s for s in ordered if s.name == "deploy"):
        if deploy.arm == "recompute":
            assert deploy.params["prefix_caching"] is True
        else:
            assert "prefix_caching" not in deploy.params
    if nodes == 2:  # simulated nodes share one CPU: the open-loop soak waits for the first node's replays
        soak = next(s for s in ordered if s.name == "soak")
        last_of_first = max(s.seq for s in ordered if s.name == "teardown" and s.node.name == "node1")
        assert last_of_first in soak.params["after"]


def _deployment(arm: str, **extra) -> Deployment:
    return Deployment(run_id="r", arm=arm, node="node1", deploy_id="abc", run_dir="/r", arm_dir="/r/a", port=8000,
                      **extra)


def test_cold_windows_empty_lmcache_dram_and_every_disk_arm_step_samples_its_device():
    urls = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    fx = _deployment("fx", lmcache_api_urls=urls, disk_device="nvme1n1")
    for name in ("populate", "evict", "measure", "probe_prompts", "fault"):
        assert steps.tier_args(name, fx) == ["--disk-device", "nvme1n1", "--lmcache-api", urls[0],
                                             "--lmcache-api", urls[1]]
    for name in ("replay", "capacity", "share", "soak"):   # production keeps DRAM warm
        assert steps.tier_args(name, fx) == ["--disk-device", "nvme1n1"]
    dram = _deployment("dram", lmcache_api_urls=urls[:1])
    assert steps.tier_args("measure", dram) == ["--lmcache-api", urls[0]]
    assert steps.tier_args("measure", _deployment("recompute")) == []


def test_the_arguments_keep_switches_and_every_value_of_a_repeatable_flag():
    args = steps.once(["replay", "--repetitions", "3", "--ordered", "--lmcache-api", "a", "--lmcache-api", "b",
                       "--lmcache-api", "a", "--repetitions", "1", "--closed-loop"])
    assert args == ["replay", "--repetitions", "1", "--ordered", "--lmcache-api", "a", "--lmcache-api", "b",
                    "--closed-loop"]
    parsed = build_parser().parse_args([*args, "--url", "http://x", "--out", "o", "--arm", "fx"])
    assert parsed.lmcache_api == ["a", "b"] and parsed.ordered and parsed.repetitions == 1
    with pytest.raises(StepError, match="flag/value"):
        steps.once(["soak", "--rate"])
    with pytest.raises(StepError, match="flag/value"):
        steps.once(["soak", "7"])


def test_every_switch_and_repeatable_flag_is_one_the_client_has():
    parser = build_parser()
    known = {option: action for action in parser._actions for option in action.option_strings}
    for switch in steps.SWITCHES:
        assert known[switch].nargs == 0, switch
    for flag in steps.REPEATABLE:
        assert type(known[flag]).__name__ == "_AppendAction", flag


def test_the_demo_sizes_its_soak_on_the_rate_the_soak_will_send_at(signed_pilot):
    pilot = signed_pilot.pilot
    plan = pilot.signed_plan.to_plan()
    assert demo_soak.planned_rate(pilot, plan) is None      # no G3 yet: the soak's closed loop
    _g3_run(pilot, [_summary("fx", "measure", 16, 1, 20, 0, 2.0)])
    measured = demo_soak.SoakRate(per_second=5.0, requests=40, seconds=8.0, warmup_seconds=2.0)
    rate = demo_soak.planned_rate(pilot, plan, measured)
    assert rate.per_second == pytest.approx(7.0) and rate.warmup_seconds == 2.0
    assert "70 % of the 10 requests/s" in rate.note and "may fall behind" in rate.note
    assert demo_soak.soak_line(rate, 100.0, 12) == "soak: open loop at 7 requests/s, 700 requests, 12 windows"

