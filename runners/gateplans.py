"""What each gate runs, on which node, in which order: the step list of a gate run (StepList builds it).

Placement rule: **every compared pair of cells runs on the same node.** The criteria compare arms
cell by cell (fx against local_nvme or recompute at one concurrency), so each node runs every arm
a gate compares, for a share of the concurrency levels; nodes then work in parallel and no
comparison ever mixes two machines. On one node, arms run one after another (one server holds
the node's GPUs at a time).

  G1  probe every node (in parallel) → on every node, in parallel, a cold start of the planned model (the recompute
      arm with empty compile caches: deploy.sh measures launch → /health, the node keeps it and later gates' health
      waits follow from it); on the first node that server then measures the recompute baseline at concurrency
      16 × repetitions (the stability of one machine across repetitions), on the others it is torn down at once.
  G2  on the first node: fx cold recovery (hit ratio; LMCache retrievals → read_bw) and the probe
      prompts on fx, then the probe prompts on recompute (output equivalence on one machine).
  G3  fx and local_nvme at 8, 16, 32 and recompute at 16, cold recovery, levels spread over nodes.
  G4  first node: replay of the customer trace on fx, then once more on an fx server whose tier is capped below
      the size the sample's reuse asks for (the capacity check), then on every other arm the signed plan's G4
      names (default: dram, the customer's alternative without FX, and recompute, which runs with vLLM's prefix
      caching on: workloads.replay.recompute_prefix_caching); cross-instance sharing: sessions
      written through the first node's fx server are read through the second node's (the shared pool
      on the FX mount; with one node a fresh server on the same node is instance B); second node
      (or the first): soak in windows, open loop at a rate planned from G3's evidence (soak_rate_plan), then a
      fault window that cuts the FX path and restores it.

Cold windows (populate → evict → measure: G1–G3's cold recovery, G2's probe prompts, G4's fault) empty every
cache above the tier under test, LMCache's DRAM included (the workload client's --lmcache-api, steps.py); G4's
replay, capacity check, sharing and soak keep DRAM warm, as production does.

Per arm: deploy → populate → evict → measure → collect → teardown (teardown always runs once its
deploy started); after every lane: evaluate (control queue) → report.
"""
from __future__ import annotations

import json
import math
import statistics
from typing import Any

from gates.judge.planner import soak_requests_needed
from gates.models import Gate
from runners.artifacts import ArtifactMismatch, EvidenceStoreError, read_artifact
from runners.models import Job, Node, Status, Step

G1_CONCURRENCY = 16
G3_LEVELS = {"fx": [8, 16, 32], "local_nvme": [8, 16, 32], "recompute": [16]}
G2_CONCURRENCY = 8
SIM_SOAK_MAX_S = 60.0
SIM_FAULT_MIN_S = 3.0
G4_ARMS = ("fx", "dram", "recompute")
"""G4's arms when the signed plan names none (the replay runs on each; fx first: the capacity check and the sharing
test read what its replay chose)."""
SOAK_RATE_FRACTION = 0.7
"""The soak's open-loop rate as a share of the fx arm's throughput G3 measured at the soak's concurrency, when the
plan's `workloads.soak.rate_fraction` does not say."""
SOAK_RATE_MARGIN = 1.05
"""On simulated nodes, a soak at its planned rate lasts at least this many times the seconds its floor's requests
take at that rate: open loop it sends rate × seconds whatever the server does (Poisson arrivals: ± 1/√n), and the
floor (--min-requests) is sent on to anyway; the margin keeps that extension rare."""
SOAK_RATE_SCHEMA = "fxpilot.soak-rate/1"


class StepList:
    """Appends steps to a job in order; each `add` returns the new step's seq for later dependencies."""

    def __init__(self, job: Job, start: int = 1):
        self.job, self.next_seq, self.steps = job, start, []

    def add(self, name: str, *, node: Node | None = None, arm: str = "", after=(), after_done=(), after_verdict=(),
            always: bool = False, requests_total: int = 0, **params) -> int:
        seq = self.next_seq
        self.next_seq += 1
        deps = {"after": list(after), "after_done": list(after_done), "after_verdict": list(after_verdict)}
        params = {**{k: v for k, v in deps.items() if v}, **({"always": True} if always else {}), **params}
        self.steps.append(Step(job=self.job, seq=seq, name=name, node=node, arm=arm, params=params,
                               requests_total=requests_total))
        return seq

    def save(self) -> list[Step]:
        return Step.objects.bulk_create(self.steps)


def workloads(job: Job) -> dict[str, dict[str, Any]]:
    """The signed plan's workloads with the run's overrides (job.params['workloads']) on top."""
    plan = job.pilot.signed_plan.to_plan()
    merged = {name: dict(values or {}) for name, values in plan.workloads.items()}
    for name, values in (job.params.get("workloads") or {}).items():
        merged.setdefault(name, {}).update(values)
    return merged


def build(job: Job, gate: Gate, nodes: list[Node], steps: StepList) -> None:
    builder = {1: _g1, 2: _g2, 3: _g3, 4: _g4}[gate.number]
    lanes = builder(job, nodes, steps, workloads(job))
    evaluate = steps.add("evaluate", after=[s for lane in lanes for s in lane.collects],
                         after_done=[lane.last for lane in lanes])
    language = job.params.get("report_language") or job.params.get("language", "en")
    steps.add("report", after_verdict=[evaluate], language=language)


class Lane:
    """The steps of one node, one after another; `last` is what the next arm on the node waits for."""

    def __init__(self, steps: StepList, node: Node, after: list[int] | None = None):
        self.steps, self.node, self.last, self.collects = steps, node, None, []
        self.start_after = list(after or [])
        self.deploy = self.previous = None
        self.arm_steps: list[int] = []
        self.arm_name = ""

    def open(self, arm: str, *, share_pool: bool = False, **deploy) -> int:
        """Deploy an arm's server once the node's previous arm is torn down; returns the deploy's seq. `deploy` goes
        into the deploy step's parameters: `cold_start=True` (G1: empty compile caches, its start measured),
        `capacity_tokens` (G4's capped tier)."""
        before = [self.last] if self.last else []
        self.arm_name = arm
        self.deploy = self.previous = self.steps.add("deploy", node=self.node, arm=arm,
                                                     after=self.start_after if not before else [], after_done=before,
                                                     share_pool=share_pool, **deploy)
        self.arm_steps = [self.deploy]
        return self.deploy

    def phase(self, name: str, params: dict, *, wait_for: list[int] | None = None, node: Node | None = None) -> int:
        """One workload step against the open arm's server (after the previous one and `wait_for`)."""
        params = dict(params)
        total = int(params.pop("requests_total", 0))
        self.previous = self.steps.add(name, node=node or self.node, arm=self.arm_name,
                                       after=[self.previous, *(wait_for or [])], deploy=self.deploy,
                                       requests_total=total, **params)
        self.arm_steps.append(self.previous)
        return self.previous

    def close(self) -> int:
        """collect → teardown (always, once the deploy started); returns the teardown's seq."""
        collect = self.steps.add("collect", node=self.node, arm=self.arm_name, after=[self.previous],
                                 deploy=self.deploy)
        self.collects.append(collect)
        self.last = self.steps.add("teardown", node=self.node, arm=self.arm_name, after_done=[*self.arm_steps, collect],
                                   always=True, deploy=self.deploy)
        return self.last

    def arm(self, arm: str, phases: list[tuple[str, dict]], *, share_pool: bool = False, **deploy) -> int:
        """deploy → the phases → collect → teardown for one arm; returns the deploy step's seq."""
        deploy = self.open(arm, share_pool=share_pool, **deploy)
        for name, params in phases:
            self.phase(name, params)
        self.close()
        return deploy

    def start_only(self, arm: str, *, cold_start: bool = False) -> int:
        """deploy → teardown: a server started (and its start measured) with no workload; returns the teardown's seq.
        The deploy step itself keeps what it measured (the cold start's artifact), so there is nothing to collect."""
        self.open(arm, **({"cold_start": True} if cold_start else {}))
        self.last = self.steps.add("teardown", node=self.node, arm=arm, after_done=list(self.arm_steps), always=True,
                                   deploy=self.deploy)
        return self.last


def _reps(job: Job, section: dict) -> int:
    """The repetitions a run measures before its first judgement: the run's own `repetitions` when it sets them,
    else the first of the signed plan's looks (judging.looks; docs/judge.md, "Planned looks"): the run stops at
    the first decided look and measures up to the next one only while the verdict is marginal."""
    if job.params.get("repetitions"):
        return int(job.params["repetitions"])
    looks = (job.pilot.signed_plan.to_plan().judging or {}).get("looks")
    return int(looks[0]) if looks else int(section.get("repetitions", 1))


def _cold_recovery(job: Job, loads: dict, levels: list[int]) -> list[tuple[str, dict]]:
    """populate → evict → measure of the cold-recovery workload at these concurrency levels."""
    section = loads.get("cold_recovery", {})
    per_client = int(section.get("requests_per_client", 2))
    reps = _reps(job, section)
    sessions = max(levels) * per_client
    # the measure step also writes every later repetition's fresh sessions (phase populate) before its eviction
    measured = sum(min(sessions, c * per_client) for c in levels) * reps + sessions * (reps - 1)
    common = {"concurrency": list(levels), "repetitions": reps}
    return [
        ("populate", {"workload": "cold_recovery", **common, "requests_total": sessions}),
        ("evict", {"workload": "cold_recovery", **common}),
        ("measure", {"workload": "cold_recovery", **common, "requests_total": measured}),
    ]


def _probe_prompts(loads: dict) -> tuple[str, dict]:
    prompts = int(loads.get("probe_prompts", {}).get("prompts", 8))
    return ("probe_prompts", {"workload": "probe_prompts", "concurrency": [G2_CONCURRENCY],
                              "requests_total": 2 * prompts})


def _g1(job: Job, nodes: list[Node], steps: StepList, loads: dict) -> list[Lane]:
    probes = [steps.add("probe", node=node) for node in nodes]
    first = Lane(steps, nodes[0], after=probes)
    first.arm("recompute", _cold_recovery(job, loads, [int(job.params.get("concurrency", G1_CONCURRENCY))]),
              cold_start=True)
    lanes = [first]
    for node in nodes[1:]:  # every other node's cold start, in parallel with the first node's baseline
        lane = Lane(steps, node, after=probes)
        lane.start_only("recompute", cold_start=True)
        lanes.append(lane)
    return lanes


def _g2(job: Job, nodes: list[Node], steps: StepList, loads: dict) -> list[Lane]:
    lane = Lane(steps, nodes[0])
    lane.arm("fx", [*_cold_recovery(job, loads, [G2_CONCURRENCY]), _probe_prompts(loads)])
    lane.arm("recompute", [_probe_prompts(loads)])
    return [lane]


def spread_levels(levels: dict[str, list[int]], count: int) -> list[dict[str, list[int]]]:
    """Concurrency levels over `count` nodes, heaviest first to the least loaded; every arm of a level together."""
    shares: list[dict[str, list[int]]] = [{} for _ in range(count)]
    load = [0] * count
    for level in sorted({c for values in levels.values() for c in values}, reverse=True):
        target = load.index(min(load))
        arms = [arm for arm, values in levels.items() if level in values]
        for arm in arms:
            shares[target].setdefault(arm, []).append(level)
        load[target] += level * len(arms)
    return [{arm: sorted(values) for arm, values in share.items()} for share in shares if share]


def _g3(job: Job, nodes: list[Node], steps: StepList, loads: dict) -> list[Lane]:
    levels = {arm: list(values) for arm, values in (job.params.get("levels") or G3_LEVELS).items()}
    lanes = []
    for node, share in zip(nodes, spread_levels(levels, len(nodes)), strict=False):
        lane = Lane(steps, node)
        for arm in ("recompute", "local_nvme", "fx"):
            if arm in share:
                lane.arm(arm, _cold_recovery(job, loads, share[arm]))
        lanes.append(lane)
    return lanes


def g4_arms(job: Job) -> tuple[str, ...]:
    """The arms G4's replay runs on: the signed plan's G4 `arms` (fx first: the capacity check and the sharing test
    read what its replay chose), else G4_ARMS. A plan whose G4 names no fx has nothing to measure FX with: fx is added
    in front."""
    try:
        named = tuple(job.pilot.signed_plan.to_plan().gate(4).arms or ())
    except (AttributeError, KeyError, LookupError, ValueError):
        named = ()
    arms = named or G4_ARMS
    return ("fx", *(arm for arm in dict.fromkeys(arms) if arm != "fx"))


def _g4(job: Job, nodes: list[Node], steps: StepList, loads: dict) -> list[Lane]:
    replay, soak, fault, share = (loads.get(name, {}) for name in ("replay", "soak", "fault", "share"))
    reps = _reps(job, replay)
    replay_step = {"workload": "replay", "repetitions": reps, "max_sessions": int(replay.get("max_sessions", 64))}
    sessions = int(share.get("sessions", 16))
    soak_step = {"workload": "soak", "windows": int(soak.get("windows", 6)), "seconds": _soak_seconds(job, soak, nodes),
                 "concurrency": [int(soak.get("concurrency", 16))]}
    # the soak's floor: the error-free requests the signed plan's soak failure-rate bars need (the planner), which the
    # soak sends on past its length to reach, for at most its length again; a run's soak_min_requests sets another
    needed = (job.params["soak_min_requests"] if "soak_min_requests" in job.params
              else soak_requests_needed(job.pilot.signed_plan.to_plan()))
    if needed:
        soak_step["min_requests"] = needed
    # open loop at a rate planned from evidence (issue 45): a share of the fx throughput G3 measured
    planned = soak_rate_plan(job.pilot, soak, job.params)
    soak_step["rate_plan"] = planned
    if planned.get("rate_per_s"):
        soak_step["rate"] = planned["rate_per_s"]
        open_on_simulated = (planned.get("source") or {}).get("kind") != "g3-throughput"
        if needed and all(n.simulated for n in nodes) and open_on_simulated:
            # a simulated soak sent open loop (a rate the run names: runners.steps.soak_rate_args keeps the closed
            # loop for a rate planned from G3 on simulated nodes) lasts long enough for its floor at that rate
            floor_s = math.ceil(needed * SOAK_RATE_MARGIN / planned["rate_per_s"])
            if floor_s > soak_step["seconds"]:
                planned["seconds_raised"] = {"from": soak_step["seconds"], "to": float(floor_s),
                                             "why": "the failure-rate bar's requests at the planned rate"}
                soak_step["seconds"] = float(floor_s)
    cut = float(fault.get("cut_seconds", 60)) * float(job.params.get("time_scale", 1.0))
    if all(n.simulated for n in nodes):
        cut = max(cut, SIM_FAULT_MIN_S)  # enough requests in each window for the judge, whatever the time scale
    fault_step = {"workload": "fault", "cut_seconds": cut,
                  "concurrency": [int(fault.get("concurrency", 8))]}
    check = (replay.get("capacity_check") or {})
    # the capacity check (issue 24, item 5): the replay's sample once more, on an fx server capped below the size
    # its reuse asks for; one repetition, sent strictly in the trace's order — a small replay, not a second full one
    capped = [] if check.get("enabled", True) is False else [("capacity", {"workload": "replay", "capped": True})]
    # the customer's alternatives: every other arm of the plan's G4 replays the same sample; recompute as the
    # customer would run vLLM without a KV tier, its prefix cache on (issue 44, item 3)
    prefix_caching = bool(replay.get("recompute_prefix_caching", True))
    others = [arm for arm in g4_arms(job) if arm != "fx"]

    def alternatives(lane: Lane) -> None:
        if capped:
            lane.arm("fx", capped, capped=True)
        for arm in others:
            lane.arm(arm, [("replay", dict(replay_step))],
                     **({"prefix_caching": prefix_caching} if arm == "recompute" else {}))

    first = Lane(steps, nodes[0])
    first.open("fx", share_pool=True)
    first.phase("replay", replay_step)
    if len(nodes) == 1:
        steps.add("note", node=nodes[0], text="cross-instance sharing needs two nodes; this site has one")
        first.phase("soak", soak_step)
        first.phase("fault", fault_step)
        first.close()
        alternatives(first)
        return [first]
    # Instance B is the second node's fx server, up while the first node's client writes through A and reads
    # through B (the shared pool on the FX mount carries the sessions); soak and fault run there afterwards.
    second = Lane(steps, nodes[1])
    reader = second.open("fx", share_pool=True)
    sharing = first.phase("share", {"workload": "share", "reader": reader, "sessions": sessions,
                                    "requests_total": 2 * sessions}, wait_for=[reader])
    first.close()
    soak_after = [sharing]
    if all(n.simulated for n in nodes):
        # simulated nodes share one machine's CPU: the open-loop soak starts once the first node's replays are done,
        # so its schedule meets the simulated server alone, not the other node's load (a demo fell 21 s behind)
        alternatives(first)
        soak_after.append(first.last)
    second.phase("soak", soak_step, wait_for=soak_after)
    second.phase("fault", fault_step)
    second.close()
    if not all(n.simulated for n in nodes):
        alternatives(first)
    return [first, second]


def soak_rate_plan(pilot, soak: dict, params: dict | None = None) -> dict[str, Any]:
    """The soak's open-loop rate and where it comes from (issue 45, item 1): the plan's `workloads.soak.rate_fraction`
    (default SOAK_RATE_FRACTION) of the fx arm's throughput G3 measured at the soak's concurrency (g3_throughput),
    in requests per second on the client's clock; a run's `soak_rate` (params) sets it instead (said so). Without
    such evidence `rate_per_s` is None and `reason` says why: the soak then runs its closed loop, and its step says
    so. The demo sizes its soak from the same plan (portal.management.demo_soak.planned_rate)."""
    params = params or {}
    concurrency = int(soak.get("concurrency", 16))
    fraction = float(soak.get("rate_fraction", SOAK_RATE_FRACTION))
    plan: dict[str, Any] = {"schema": SOAK_RATE_SCHEMA, "concurrency": concurrency, "fraction": fraction,
                            "arrivals": str(soak.get("arrivals", "poisson")), "rate_per_s": None}
    if soak.get("max_lateness_s") is not None:   # the bound on the sends' lateness p99 (default: the client's)
        plan["max_lateness_s"] = float(soak["max_lateness_s"])
    if params.get("soak_rate"):
        return {**plan, "rate_per_s": float(params["soak_rate"]), "fraction": None,
                "source": {"kind": "run-parameter", "parameter": "soak_rate"}}
    if not 0 < fraction <= 1:
        return {**plan, "reason": f"workloads.soak.rate_fraction is {fraction:g}; it must be above 0 and at most 1"}
    measured = g3_throughput(pilot, arm="fx", concurrency=concurrency)
    if "per_second" not in measured:
        return {**plan, "reason": measured["reason"]}
    return {**plan, "rate_per_s": round(fraction * measured["per_second"], 6), "source": measured}


def soak_rate_source(planned: dict) -> str:
    """Where a soak's planned rate comes from, in words (the run log and the reports)."""
    source = planned.get("source") or {}
    if source.get("kind") == "run-parameter":
        return "set by the run's soak_rate"
    if source.get("kind") == "g3-throughput":
        return (f"{100 * float(planned['fraction']):g} % of the {float(source['per_second']):.3g} requests/s the "
                f"{source['arm']} arm served at concurrency {source['concurrency']} in G3 run "
                f"{str(source['job'])[:8]}, median of {source['repetitions']} repetitions")
    return planned.get("reason") or "no source"


def g3_throughput(pilot, *, arm: str, concurrency: int) -> dict[str, Any]:
    """What the pilot's last G3 run that ended successfully measured for `arm` at `concurrency`: per repetition,
    the error-free requests of its measure window ÷ the window's seconds on the client's clock (duration_s of the
    phase summaries: a simulated server's window as this machine served it), and their median (`per_second`).
    Without such a run or cell, {"reason": …} says what is missing."""
    gate = pilot.gates.filter(number=3).first()
    if gate is None:
        return {"reason": "the pilot has no G3"}
    runs = Job.objects.filter(gate=gate, status=Status.SUCCESSFUL).order_by("-finished", "-created")
    for run in runs:
        windows = _measure_windows(run, arm, concurrency)
        if windows is None:
            return {"reason": f"G3 run {str(run.code)[:8]}'s phase summaries cannot be read"}
        if not windows:
            continue
        rates = [w["per_second"] for w in windows]
        return {"kind": "g3-throughput", "gate": 3, "job": str(run.code), "arm": arm, "concurrency": concurrency,
                "per_second": round(statistics.median(rates), 6), "statistic": "median over repetitions",
                "clock": "client", "repetitions": len(windows), "windows": windows,
                "time_scale": float(run.params.get("time_scale", 1.0))}
    if not runs.exists():
        return {"reason": "G3 has no successful run: the soak's rate is planned from the fx throughput G3 measures"}
    return {"reason": f"no successful G3 run measured {arm} at concurrency {concurrency} (the soak's concurrency)"}


def _measure_windows(run: Job, arm: str, concurrency: int) -> list[dict] | None:
    """The measure windows of `arm` at `concurrency` in a run's phase summaries (None: a summary unreadable)."""
    windows = []
    for artifact in run.artifacts.filter(kind="phase-summary").order_by("name"):
        try:
            lines = read_artifact(artifact).decode("utf-8", errors="replace").splitlines()
        except (ArtifactMismatch, EvidenceStoreError, OSError):
            return None
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not (isinstance(row, dict) and row.get("arm") == arm and row.get("phase") == "measure"
                    and row.get("concurrency") == concurrency):
                continue
            ok = int(row.get("requests") or 0) - int(row.get("errors") or 0)
            seconds = float(row.get("duration_s") or 0.0)
            if ok > 0 and seconds > 0:
                windows.append({"repetition": row.get("repetition"), "instance": row.get("instance"),
                                "requests_ok": ok, "seconds": round(seconds, 6),
                                "per_second": round(ok / seconds, 6)})
    return windows


def _soak_seconds(job: Job, soak: dict, nodes: list[Node]) -> float:
    """The plan's soak hours at the run's time scale; on simulated nodes at most SIM_SOAK_MAX_S (a demo, not a soak)."""
    if job.params.get("soak_seconds"):
        return float(job.params["soak_seconds"])
    seconds = float(soak.get("hours", 24)) * 3600 * float(job.params.get("time_scale", 1.0))
    return min(seconds, SIM_SOAK_MAX_S) if all(n.simulated for n in nodes) else seconds


def extension(job: Job, steps: StepList, first_repetition: int, extra: int) -> list[int]:
    """More repetitions of every measured cell, each on the node and with the arm it was measured with first.

    Each node gets deploy → populate → evict → measure (repetitions first_repetition…) → collect → teardown
    per arm, as in the run itself; returns the collect and teardown seqs the new evaluate waits for.
    """
    lanes: dict[int, Lane] = {}
    waits: list[int] = []
    measured = job.steps.filter(name="measure").select_related("node").order_by("seq")
    for measure in (m for m in measured if "first_repetition" not in m.params):  # the run's own cells, once each
        lane = lanes.setdefault(measure.node_id, Lane(steps, measure.node))
        levels = list(measure.params.get("concurrency") or [])
        phases = _cold_recovery(job, workloads(job), levels)
        for name, params in phases:
            params.update(repetitions=extra, first_repetition=first_repetition)
            if name == "measure":
                per_client = int(workloads(job).get("cold_recovery", {}).get("requests_per_client", 2))
                sessions = max(levels) * per_client
                params["requests_total"] = (sum(min(sessions, c * per_client) for c in levels) * extra
                                            + sessions * (extra - 1))
        lane.arm(measure.arm, phases)
    for lane in lanes.values():
        waits += [*lane.collects, lane.last]
    return waits
