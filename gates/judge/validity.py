"""Validity before performance (the MLPerf rule): a run that is not valid cannot pass.

Each check returns {"name", "ok", "detail"}; `detail` says what was seen, in English, so a person can
fix the run. A check whose detail is made of catalogue sentences also records them as `detail_said`: a list of
{"template": a sentence marked with gettext_noop, with %(name)s fields, "values": {name: text}}, one per part of
`detail` (which is those parts in English, joined by "; "), so a page or a report says it in the reader's
language without parsing the English back (reports.checks). Verdicts stored before it have `detail` only.
Missing kinds of input altogether (an arm with no records, no inventory for G1) are not
checks but RecordErrors: there is nothing to judge.
"""
from __future__ import annotations

import numpy as np

from gates.judge import counters, intervals, tiers
from gates.judge.bootstrap import QUANTILES
from gates.judge.lazy import pd
from gates.judge.metrics import (
    INVENTORY_ONLY,
    REPETITION_METRICS,
    REQUEST_METRICS,
    TIMING_METRICS,
    gpu_devices,
    nic_list,
)
from gates.judge.records import Inputs, RecordError, plain
from gates.judge.words import gettext_noop
from gates.plan import CriterionSpec, GatePlan
from gates.traces import capacity as trace_capacity

RECOMPUTE_ARM = "recompute"
RECOMPUTE_MAX_HIT = 0.05      # a recompute arm that serves more than 5 % of its prompt from cache is not recompute
CACHE_MIN_HIT = 0.5           # a cache arm that recovers less than half its prompt did not exercise the tier
GPU_COLD_MAX_HIT = 0.05       # after eviction the GPU prefix cache must be cold, or HBM was measured, not the tier
HIT_PHASES = ("measure",)     # phases that come right after an eviction
CLIENT_CPU_MAX = 0.9          # a single-threaded client busy 90 % of the time could not keep up
OPEN_LOOP_PHASES = ("replay", "capacity")  # sent at the trace's arrival times: concurrency is a cap, not a target
FIDELITY_SHARE = 0.8          # the replay must reach this share of the reuse its trace allows (workloads.replay)
FIDELITY_CEILING_TOLERANCE = 0.05   # and not more than the trace allows by over this share of it (issue 44 item 2)
LITTLE_REUSE = 0.10           # gates.traces.analysis.LITTLE_REUSE: below it the traffic "has little reuse"
FAULT_PHASES = ("fault", "recovery")  # G4's path cut: during it and after the path is back


def select(frame: pd.DataFrame, arm: str, phase: str) -> pd.DataFrame:
    rows = frame["arm"] == arm
    if phase != "any":
        rows &= frame["phase"] == phase
    return frame[rows]


def levels(spec: CriterionSpec, frame: pd.DataFrame) -> list[int]:
    """The concurrency levels a criterion judges: its own list, or every level its candidate ran at."""
    if spec.concurrency:
        return sorted(spec.concurrency)
    return sorted(int(c) for c in select(frame, spec.candidate, spec.phase)["concurrency"].unique())


def pooled_rate(spec: CriterionSpec) -> bool:
    """A failure-rate bar (exact bound, not a count) without its own concurrency list pools every level."""
    return (spec.metric == "error_rate" and spec.statistic != "count" and not spec.concurrency
            and not (spec.threshold <= 0 and spec.op in ("<=", "==")))


def uses_requests(spec: CriterionSpec) -> bool:
    return spec.metric in REQUEST_METRICS | REPETITION_METRICS | {"output_match"}


def require_inputs(gate: GatePlan, inputs: Inputs, frame: pd.DataFrame) -> None:
    """Raise RecordError when a kind of input the gate needs is missing altogether."""
    request_files = ", ".join(inputs.sources("requests")) or "the files given"
    arms: list[str] = []
    for spec in gate.criteria:
        if uses_requests(spec):
            arms += [a for a in (spec.candidate, spec.baseline) if a and a not in arms]
    if arms:
        if len(frame) == 0:
            raise RecordError(request_files, f"{gate.label} needs request records (fxpilot.request/1) and none were given")
        if not frame["ok"].any():
            raise RecordError(request_files, "zero successful requests (every record has status 'error')", field="status")
        present = set(frame["arm"].unique())
        for arm in arms:
            if arm not in present:
                raise RecordError(request_files, f"{gate.label} needs arm {arm!r} but no record has it "
                                  f"(arms present: {', '.join(sorted(present))})", field="arm")
            if not frame.loc[frame["arm"] == arm, "ok"].any():
                raise RecordError(request_files, f"arm {arm!r}: zero successful requests", field="status")
    for spec in gate.criteria:
        if spec.metric == "read_bw":
            retrieves = inputs.retrieves
            if spec.candidate:
                retrieves = retrieves[retrieves["arm"] == spec.candidate]
            if len(retrieves) == 0:
                what = f" for arm {spec.candidate!r}" if spec.candidate else ""
                raise RecordError(", ".join(inputs.sources("retrieve")) or "the files given",
                                  f"{spec.key} needs LMCache retrieval records (fxpilot.retrieve/1){what}; none were given",
                                  field="arm" if spec.candidate else None)
        if spec.metric in INVENTORY_ONLY and not inputs.inventories:
            raise RecordError("the files given", f"{spec.key} needs node inventories (fxpilot.inventory/1); none were given")


Said = dict  # {"template": a catalogue sentence, "values": {name: text}}


def said(template: str, **values) -> Said:
    """A part of a check's detail as it is made: its sentence (marked with gettext_noop where it is written) and values."""
    return {"template": template, "values": {k: str(v) for k, v in values.items()}}


def english(part: str | Said) -> str:
    return part if isinstance(part, str) else part["template"] % part["values"]


def _check(name: str, problems: list[str | Said], ok_detail: str | Said | list[Said]) -> dict:
    """The check; parts given as `said` sentences are kept as `detail_said` when every part of the detail is one."""
    parts = problems if problems else (ok_detail if isinstance(ok_detail, list) else [ok_detail])
    out = {"name": name, "ok": not problems, "detail": "; ".join(english(p) for p in parts)}
    if parts and all(isinstance(p, dict) for p in parts):
        out["detail_said"] = list(parts)
    return out


def check(gate: GatePlan, inputs: Inputs, frame: pd.DataFrame, judging: dict, *, warmup_windows: int = 1,
          confidence_of=None, final: bool = True, expect: dict | None = None) -> list[dict]:
    checks = [_simulated(inputs), _duplicates(inputs.requests), _versions(inputs)]
    checks += _coverage(gate, frame, judging, warmup_windows)
    if any(spec.metric == "error_rate" for spec in gate.criteria) and final:
        # before the last look too few requests only leave a rate bar marginal: the next look has more
        checks.append(_rate_requests(gate, frame, confidence_of or (lambda spec: spec.confidence or 0.95)))
    if any(spec.metric in ("gpu_count", "gpu_model_match", "link_speed_gbps") for spec in gate.criteria):
        checks.append(_inventory_complete(gate, inputs))
    checks.append(_hit_behaviour(gate, inputs, frame))
    checks.append(_connector(gate, inputs, frame))
    checks.append(_page_cache(gate, inputs))
    checks.append(_fingerprint(gate, inputs, expect))
    checks.append(tiers.dram_cleared(gate, inputs))
    checks.append(tiers.tier_bytes_match(gate, inputs, judging))
    checks.append(_client(inputs))
    if any("schedule_kept" in s for s in inputs.summaries):
        checks.append(_schedule_kept(inputs))
    if any(spec.metric == "output_match" for spec in gate.criteria):
        checks.append(_hashes(gate, inputs.requests, frame))
    if any(spec.phase == "share" for spec in gate.criteria):
        checks.append(_other_instance(inputs.requests))
        checks.append(_chunk_hash(gate, inputs, expect))
    if any(spec.phase in FAULT_PHASES for spec in gate.criteria):
        checks.append(_fault_cut(gate, inputs))
    if any(spec.metric == "external_hit_ratio" for spec in gate.criteria):
        checks.append(_external_hits(gate, inputs))
    if any(spec.metric == "read_bw" for spec in gate.criteria):
        checks.append(_read_bw_measured(gate, inputs))
    return checks


SIMULATOR_GAUGE = "fxpilot_simulated"  # the simulated server's /metrics says what it is (runners/sim/server.py)


def summary_simulated(summary: dict) -> bool:
    """A phase summary is simulated when it says so or when the server's /metrics it scraped carry the
    simulator's gauge: a node registered as real that answers with the simulator is still the simulator."""
    if summary.get("simulated"):
        return True
    return any(SIMULATOR_GAUGE in (summary.get(key) or {}) for key in ("metrics_before", "metrics_after"))


def _simulated(inputs: Inputs) -> dict:
    flags = set(inputs.requests["simulated"].unique().tolist()) if len(inputs.requests) else set()
    if len(inputs.retrieves):
        flags |= set(inputs.retrieves["simulated"].astype(bool).unique().tolist())
    flags |= {summary_simulated(s) for s in inputs.summaries} | {bool(i["simulated"]) for i in inputs.inventories}
    problems = [said(gettext_noop("simulated and real inputs are mixed: a verdict rests on one or the other"))] \
        if len(flags) > 1 else []
    unmasked = [s for s in inputs.summaries if summary_simulated(s) and not s.get("simulated")]
    if unmasked:
        first = unmasked[0]
        problems.append(said(gettext_noop("%(n)s phase summary(ies) say simulated: false but the server's /metrics carry "
                                          "%(gauge)s (e.g. %(cell)s rep %(rep)s in %(source)s): the answers came from "
                                          "the simulator"), n=len(unmasked), gauge=SIMULATOR_GAUGE,
                             cell=f"{first['arm']}/{first['phase']}@{first['concurrency']}", rep=first["repetition"],
                             source=first.get("_source", "a phase summary")))
    return _check("no-simulated-mixed-with-real", problems,
                  said(gettext_noop("all inputs are simulated")) if flags == {True} else said(gettext_noop("all inputs are real")))


# A request is known by what it was and when it happened, not by the file or run_id it arrived under:
# the same records given twice (a vllm bench file under two names, a records file copied with a new run_id)
# would double n and narrow every interval. A copy relabelled as another repetition is caught too.
DUPLICATE_KEYS = ["arm", "phase", "session", "prompt_tokens", "output_tokens", "t_send", "t_first_token", "t_end"]


def _duplicates(requests: pd.DataFrame) -> dict:
    if len(requests) < 2:
        return _check("no-duplicate-requests", [], said(gettext_noop("no request appears twice")))
    keys = requests[DUPLICATE_KEYS].copy()
    keys["t_first_token"] = keys["t_first_token"].fillna(-1.0)
    copies = requests[keys.duplicated(keep="first").to_numpy()]
    problems = []
    if len(copies):
        first = copies.iloc[0]
        original = requests[(keys == keys.loc[first.name]).all(axis=1).to_numpy()].iloc[0]
        problems.append(said(gettext_noop("%(n)s request record(s) repeat another record's content (session, tokens and "
                                          "timestamps), e.g. session %(session)s at %(source)s line %(line)s, the same "
                                          "as %(original)s line %(original_line)s: give each measurement once"),
                             n=len(copies), session=repr(plain(first["session"])), source=first["_source"],
                             line=plain(first["_line"]), original=original["_source"],
                             original_line=plain(original["_line"])))
    return _check("no-duplicate-requests", problems, said(gettext_noop("no request appears twice (compared by content)")))


def _rate_requests(gate: GatePlan, frame: pd.DataFrame, confidence_of) -> dict:
    """An exact bound shows a rate bar only with enough requests: say how many, rather than pass on nothing."""
    problems, seen = [], []
    for spec in gate.criteria:
        if spec.metric != "error_rate" or spec.statistic == "count" or spec.op not in ("<=", "<") \
                or spec.threshold <= 0:
            continue
        needed = intervals.error_free_needed(spec.threshold, confidence_of(spec))
        rows = select(frame, spec.candidate, spec.phase)
        for level in [None] if pooled_rate(spec) else levels(spec, frame):
            n = int(len(rows) if level is None else (rows["concurrency"] == level).sum())
            at = f"{spec.candidate}/{spec.phase}" + ("" if level is None else f"@{level}")
            if needed is not None and n < needed:
                problems.append(said(gettext_noop("%(criterion)s: too few requests to show ≤ %(pct)s %% at %(cell)s; "
                                                  "needs ≥ %(needed)s error-free requests (has %(n)s)"),
                                     criterion=spec.key, pct=plain(spec.threshold * 100), cell=at, needed=f"{needed:,}",
                                     n=f"{n:,}"))
            else:
                seen.append(said(gettext_noop("%(criterion)s %(cell)s: %(n)s requests"), criterion=spec.key, cell=at, n=f"{n:,}"))
    return _check("enough-requests-for-rates", problems, seen or said(gettext_noop("no rate bar to show")))


def _inventory_complete(gate: GatePlan, inputs: Inputs) -> dict:
    """What G1 checks must be recorded: the per-GPU list (every GPU's model) and each RDMA port's state.
    Missing is not passing."""
    metrics = {spec.metric for spec in gate.criteria}
    problems = []
    for inventory in inputs.inventories:
        node = inventory["node"]
        if metrics & {"gpu_count", "gpu_model_match"}:
            devices = gpu_devices(inventory)
            if devices is None:
                problems.append(said(gettext_noop("node %(node)s: field 'gpus.devices' (the per-GPU list) is missing; "
                                                  "the inventory must record every GPU's index and model"), node=node))
            else:
                for position, device in enumerate(devices):
                    if not isinstance(device, dict) or device.get("index") is None or not device.get("model"):
                        problems.append(said(gettext_noop("node %(node)s: field 'gpus.devices[%(i)s]' lacks its index "
                                                          "or model"), node=node, i=position))
                        break
        if "link_speed_gbps" in metrics:
            for nic in nic_list(inventory):
                if nic.get("rdma_device") and not nic.get("rdma_state"):
                    problems.append(said(gettext_noop("node %(node)s: field 'nics.%(nic)s.rdma_state' is missing or "
                                                      "unknown; the RDMA port state (ACTIVE, DOWN, …) must be recorded"),
                                         node=node, nic=nic.get("name")))
    return _check("inventory-complete", problems,
                  said(gettext_noop("every node records its GPUs one by one and its RDMA port states")))


def _versions(inputs: Inputs) -> dict:
    """Versions recorded somewhere, and the same in every phase summary: arms differ only in where the cache lives."""
    found = []
    for inventory in inputs.inventories:
        lmcache = inventory.get("lmcache")
        lmcache = (lmcache.get("version") or lmcache.get("commit")) if isinstance(lmcache, dict) else lmcache
        if inventory.get("vllm") and lmcache:
            found.append(said(gettext_noop("vLLM %(v)s, LMCache %(l)s (node %(node)s)"), v=inventory["vllm"], l=lmcache,
                              node=inventory["node"]))
    reported = set()
    for summary in inputs.summaries:
        versions = summary.get("versions") or {}
        lmcache = versions.get("lmcache") or versions.get("lmcache_commit")
        if versions.get("vllm") and lmcache:
            found.append(said(gettext_noop("vLLM %(v)s, LMCache %(l)s (phase summary)"), v=versions["vllm"], l=lmcache))
            reported.add(f"vLLM {versions['vllm']} / LMCache {lmcache}")
    problems = [] if found else [said(gettext_noop("no inventory or phase summary records the vLLM and LMCache versions"))]
    if len(reported) > 1:
        problems.append(said(gettext_noop("the phase summaries report different versions (%(versions)s)"),
                             versions="; ".join(sorted(reported))))
    return _check("versions-recorded", problems, found[0] if found else [])


def needs_repetitions(spec: CriterionSpec) -> bool:
    """Criteria whose interval comes from the spread across repetitions (≥ 2 needed): timing statistics
    (TTFT, throughput) and every CV."""
    return spec.metric in TIMING_METRICS or spec.statistic == "cv"


def _coverage(gate: GatePlan, frame: pd.DataFrame, judging: dict, warmup_windows: int = 1) -> list[dict]:
    missing, thin, short, few_reps = [], [], [], []
    min_requests = int(judging["min_requests_per_cell"])
    min_seconds = float(judging["min_cell_seconds"])
    seen: set[tuple] = set()
    for spec in gate.criteria:
        if not uses_requests(spec):
            continue
        arms = [a for a in (spec.candidate, spec.baseline) if a]
        concurrency = levels(spec, frame)
        if not concurrency:
            missing.append(said(gettext_noop("%(criterion)s: arm %(arm)s has no records in phase %(phase)s"),
                                criterion=spec.key, arm=repr(spec.candidate), phase=repr(spec.phase)))
        for arm in arms:
            rows = select(frame, arm, spec.phase)
            for level in concurrency if spec.metric != "output_match" else [None]:
                cell = rows if level is None else rows[rows["concurrency"] == level]
                at = f" at concurrency {level}" if level is not None else ""
                if not cell["ok"].any():
                    missing.append(said(gettext_noop("%(criterion)s: arm %(arm)s has no successful request in phase "
                                                     "%(phase)s at concurrency %(level)s") if level is not None else
                                        gettext_noop("%(criterion)s: arm %(arm)s has no successful request in phase "
                                                     "%(phase)s"), criterion=spec.key, arm=repr(arm),
                                        phase=repr(spec.phase), level=level))
                    continue
                reps = sorted(cell.loc[cell["ok"], "repetition"].unique())
                if spec.comparison == "drift":
                    steady = len(reps) - warmup_windows
                    if steady < 4:
                        few_reps.append(said(gettext_noop("%(criterion)s: %(cell)s has %(n)s window(s), %(steady)s "
                                                          "after %(warmup)s warm-up; drift compares two early with two "
                                                          "late steady windows, so it needs at least %(needed)s"),
                                             criterion=spec.key, cell=f"{arm}{at}", n=len(reps), steady=max(steady, 0),
                                             warmup=warmup_windows, needed=warmup_windows + 4))
                    few_reps += _small_windows(spec, cell, reps[warmup_windows:], f"{arm}{at}")
                elif needs_repetitions(spec) and len(reps) < 2:
                    few_reps.append(said(gettext_noop("%(criterion)s: %(cell)s has %(n)s repetition; its interval "
                                                      "comes from the spread across repetitions, so it needs at least 2"),
                                         criterion=spec.key, cell=f"{arm}{at}", n=len(reps)))
                if spec.phase == "any" or spec.metric == "output_match":
                    continue
                for (phase, conc, rep), sub in cell.groupby(["phase", "concurrency", "repetition"], sort=True, observed=True):
                    key = (arm, phase, conc, rep)
                    if key in seen:
                        continue
                    seen.add(key)
                    n_ok = int(sub["ok"].sum())
                    if n_ok < min_requests:
                        thin.append(said(gettext_noop("%(cell)s rep %(rep)s: %(n)s successful requests < %(min)s"),
                                         cell=f"{arm}/{phase}@{conc}", rep=rep, n=n_ok, min=min_requests))
                    span = float(sub["t_end"].max() - sub["t_send"].min())
                    if span < min_seconds:
                        short.append(said(gettext_noop("%(cell)s rep %(rep)s: %(s)s s < %(min)s s"),
                                          cell=f"{arm}/{phase}@{conc}", rep=rep, s=f"{span:.1f}", min=f"{min_seconds:g}"))
    return [
        _check("arms-and-levels-present", missing,
               said(gettext_noop("every arm, phase and concurrency level the criteria compare is present"))),
        _check("min-requests-per-cell", thin, said(gettext_noop("every cell has at least %(n)s successful requests"), n=min_requests)),
        _check("min-cell-seconds", short, said(gettext_noop("every cell lasted at least %(s)s s"), s=f"{min_seconds:g}")),
        _check("repetitions", few_reps, said(gettext_noop("at least 2 repetitions for every TTFT, throughput and CV criterion; "
                                                "enough soak windows for drift"))),
    ]


def _small_windows(spec: CriterionSpec, cell: pd.DataFrame, steady: list, where: str) -> list[Said]:
    """A drift criterion is judged on the quantile it names in every steady window (judge version 6): a window
    with fewer successful requests than that quantile's distribution-free interval needs
    (intervals.quantile_min_requests: 36 for p90, 368 for p99) cannot estimate it, and is named."""
    q = QUANTILES.get(spec.statistic)
    if q is None or not 0 < q < 1:
        return []
    needed = intervals.quantile_min_requests(q)
    counts = {int(w): int(((cell["repetition"] == w) & cell["ok"]).sum()) for w in steady}
    small = {w: n for w, n in counts.items() if n < needed}
    if not small:
        return []
    listed = ", ".join(f"window {w}: {n}" for w, n in sorted(small.items())[:4]) + \
        (f" and {len(small) - 4} more" if len(small) > 4 else "")
    return [said(gettext_noop("%(criterion)s: %(cell)s: a %(statistic)s needs at least %(needed)s successful requests "
                              "per steady window to be estimated from the window's own requests (%(listed)s): the "
                              "soak is too short for its criterion's statistic"),
                 criterion=spec.key, cell=where, statistic=spec.statistic, needed=needed, listed=listed)]


def _delta(summary: dict, name: str) -> float | None:
    before, after = summary.get("metrics_before") or {}, summary.get("metrics_after") or {}
    if name in before and name in after:
        return float(after[name]) - float(before[name])
    return None


def _hit_behaviour(gate: GatePlan, inputs: Inputs, frame: pd.DataFrame) -> dict:
    """≈0 cache hits for recompute and ≈all for cache arms after eviction; a hit-ratio criterion of the
    gate judges its own arm and phase, so the validity bar does not pre-empt it."""
    judged = {(s.candidate, s.phase) for s in gate.criteria if s.metric == "hit_ratio"}
    arms = sorted({a for s in gate.criteria if uses_requests(s) for a in (s.candidate, s.baseline) if a})
    # Only phases the gate judges: G4's fault run, for one, sends warm requests labelled measure before its cut.
    phases_judged = {s.phase for s in gate.criteria if uses_requests(s)}
    problems, seen = [], []
    for arm in arms:
        for phase in HIT_PHASES:
            if phase not in phases_judged and "any" not in phases_judged:
                continue
            rows = frame[(frame["arm"] == arm) & (frame["phase"] == phase) & frame["ok"]]
            summaries = [s for s in inputs.summaries if s["arm"] == arm and s["phase"] == phase]
            if len(rows) == 0 and not summaries:
                continue
            evidence = False
            reported = rows[rows["cached_tokens"].notna()]
            if len(reported):
                evidence = True
                ratio = float(reported["cached_tokens"].sum()) / max(float(reported["prompt_tokens"].sum()), 1.0)
                seen.append(said(gettext_noop("%(where)s %(ratio)s of prompt tokens cached"), where=f"{arm}/{phase}",
                                 ratio=f"{ratio:.1%}"))
                problems += _hit_problem(arm, phase, ratio, judged, "records")
            external = [d for d in (_delta(s, "vllm:external_prefix_cache_hits_total") for s in summaries) if d is not None]
            gpu = [d for d in (_delta(s, "vllm:prefix_cache_hits_total") for s in summaries) if d is not None]
            prompt = [d for d in (_delta(s, "vllm:prompt_tokens_total") for s in summaries) if d is not None]
            if arm != RECOMPUTE_ARM:
                problems += _instances_unverified(arm, phase, inputs.requests.loc[rows.index, "instance"], summaries)
            if prompt and (external or gpu):
                evidence = True
                total = max(sum(prompt), 1.0)
                ratio = (sum(external) + (sum(gpu) if arm == RECOMPUTE_ARM else 0.0)) / total
                seen.append(said(gettext_noop("%(where)s /metrics: %(ratio)s external hits"),
                                 where=f"{arm}/{phase}", ratio=f"{ratio:.1%}"))
                problems += _hit_problem(arm, phase, ratio, judged, "metrics")
                if gpu and sum(gpu) / total > GPU_COLD_MAX_HIT:
                    problems.append(said(gettext_noop("%(where)s: the GPU prefix cache served %(ratio)s of the prompt "
                                                      "tokens; the eviction did not make it cold"),
                                         where=f"{arm}/{phase}", ratio=f"{sum(gpu) / total:.1%}"))
            if not evidence:
                problems.append(said(gettext_noop("%(where)s: no cached_tokens in the records and no /metrics deltas in "
                                                  "a phase summary, so the arm's cache behaviour cannot be verified"),
                                     where=f"{arm}/{phase}"))
    if RECOMPUTE_ARM in arms and len(inputs.retrieves) and (inputs.retrieves["arm"] == RECOMPUTE_ARM).any():
        # whatever phases the gate measures recompute in (G2: probes only)
        problems.append(said(gettext_noop("%(arm)s: LMCache logged retrievals for the recompute arm; it must have no KV "
                                          "connector"), arm=RECOMPUTE_ARM))
    return _check("hit-behaviour-matches-arm", problems, seen or said(gettext_noop("no measure phase to check")))


PILOT_CONNECTOR = "LMCacheConnectorV1"


def _connector(gate: GatePlan, inputs: Inputs, frame: pd.DataFrame) -> dict:
    """A real cache arm's server ran LMCache: its phase summaries carry the deploy manifest's `kv_connector`
    (versions.kv_connector). vLLM's ExampleConnector keeps whole prompts' KV as files and is a pipeline check,
    not the tier on trial; a simulated run is labelled as such and not checked here."""
    arms = sorted({a for s in gate.criteria for a in (s.candidate, s.baseline)
                   if a and a != RECOMPUTE_ARM and s.metric not in INVENTORY_ONLY and s.metric != "read_bw"})
    problems, seen = [], []
    for arm in arms:
        summaries = [s for s in inputs.summaries if s["arm"] == arm]
        real_rows = len(frame) and bool((~inputs.requests.loc[frame.index[frame["arm"] == arm], "simulated"]
                                         .astype(bool)).any())
        real_summaries = [s for s in summaries if not summary_simulated(s)]
        if not real_summaries and not real_rows:
            continue
        named = sorted({str((s.get("versions") or {}).get("kv_connector")) for s in real_summaries
                        if (s.get("versions") or {}).get("kv_connector")})
        if not named:
            problems.append(said(gettext_noop("%(arm)s: cannot be verified: no phase summary names the KV connector the "
                                              "server ran (versions.kv_connector from the deploy manifest); a real cache "
                                              "arm must run %(connector)s"), arm=arm, connector=PILOT_CONNECTOR))
        elif named != [PILOT_CONNECTOR]:
            others = ", ".join(n for n in named if n != PILOT_CONNECTOR)
            problems.append(said(gettext_noop("%(arm)s: the server ran the KV connector %(others)s (per the deploy "
                                              "manifest), not %(connector)s: its hits are not LMCache's tiers"),
                                 arm=arm, others=others, connector=PILOT_CONNECTOR))
        else:
            seen.append(said(gettext_noop("%(arm)s: %(connector)s"), arm=arm, connector=PILOT_CONNECTOR))
    return _check("kv-connector-is-lmcache", problems, seen or said(gettext_noop("no real cache arm to check")))


PAGE_CACHE_DROPPED = "page cache dropped"  # what the workload client's eviction says when it did drop it


def _page_cache(gate: GatePlan, inputs: Inputs) -> dict:
    """Before a cold read the page cache was dropped or the tier read with O_DIRECT, so a "disk" hit is not a DRAM
    hit (design §5). Evidence per real cache arm's measure phase: the deploy manifest's page_cache settings (in
    versions.page_cache) or the eviction's own words in the phase summary."""
    arms = {a for s in gate.criteria if uses_requests(s) for a in (s.candidate, s.baseline) if a and a != RECOMPUTE_ARM}
    phases = {s.phase for s in gate.criteria if uses_requests(s)}
    if not phases & (set(HIT_PHASES) | {"any"}):
        return _check("page-cache-bypassed", [], said(gettext_noop("no measure phase after an eviction to check")))
    problems, seen = [], []
    for arm in sorted(arms):
        rows = [s for s in inputs.summaries if s["arm"] == arm and s["phase"] in HIT_PHASES and not summary_simulated(s)]
        if not rows:
            continue
        bad = []
        for summary in rows:
            page_cache = (summary.get("versions") or {}).get("page_cache") or {}
            eviction = summary.get("eviction") or {}
            if page_cache.get("use_odirect") is True or eviction.get("drop-caches") == PAGE_CACHE_DROPPED:
                continue
            how = eviction.get("drop-caches") or "no page-cache drop in the eviction"
            bad.append(f"{summary['phase']}@{summary['concurrency']} rep {summary['repetition']} ({how})")
        if bad:
            problems.append(said(gettext_noop("%(arm)s: neither O_DIRECT (deploy manifest page_cache.use_odirect) nor a "
                                              "dropped page cache before the cold read, so a disk hit may have been a "
                                              "DRAM hit: %(cells)s"), arm=arm,
                                 cells="; ".join(bad[:3]) + (f"; {len(bad) - 3} more" if len(bad) > 3 else "")))
        else:
            seen.append(said(gettext_noop("%(arm)s: %(n)s measured cell(s) read with O_DIRECT or after a page-cache drop"),
                             arm=arm, n=len(rows)))
    return _check("page-cache-bypassed", problems, seen or said(gettext_noop("no real cache arm to check")))


# a hit ratio read from the records' own field or from the server's counters, said whole in the catalogue
HIT_SENTENCES = {
    ("recompute", "records"): gettext_noop("%(where)s: %(ratio)s of prompt tokens came from cache per the records' "
                                           "cached_tokens; recompute must be ≤ %(bound)s"),
    ("recompute", "metrics"): gettext_noop("%(where)s: %(ratio)s of prompt tokens came from cache per the /metrics "
                                           "deltas; recompute must be ≤ %(bound)s"),
    ("cache", "records"): gettext_noop("%(where)s: only %(ratio)s of prompt tokens came from cache per the records' "
                                       "cached_tokens; a cache arm must recover ≥ %(bound)s after eviction"),
    ("cache", "metrics"): gettext_noop("%(where)s: only %(ratio)s of prompt tokens came from cache per the /metrics "
                                       "deltas; a cache arm must recover ≥ %(bound)s after eviction"),
}


def _hit_problem(arm: str, phase: str, ratio: float, judged: set, source: str) -> list[Said]:
    if arm == RECOMPUTE_ARM and ratio > RECOMPUTE_MAX_HIT:
        return [said(HIT_SENTENCES["recompute", source], where=f"{arm}/{phase}", ratio=f"{ratio:.1%}",
                     bound=f"{RECOMPUTE_MAX_HIT:.0%}")]
    if arm != RECOMPUTE_ARM and (arm, phase) not in judged and ratio < CACHE_MIN_HIT:
        return [said(HIT_SENTENCES["cache", source], where=f"{arm}/{phase}", ratio=f"{ratio:.1%}",
                     bound=f"{CACHE_MIN_HIT:.0%}")]
    return []


def _client(inputs: Inputs) -> dict:
    problems, checked = [], 0
    for summary in inputs.summaries:
        in_flight = summary.get("max_in_flight")
        # an open-loop phase (the trace's replay, a soak sent on a schedule: `schedule_kept` recorded) sends when a
        # request is due, so its concurrency is a cap, not a target: schedule-kept judges its client instead
        if in_flight is None or summary["phase"] in OPEN_LOOP_PHASES or "schedule_kept" in summary:
            continue
        checked += 1
        wanted = summary["concurrency"]
        if summary.get("requests") is not None:
            wanted = min(wanted, summary["requests"])
        where = f"{summary['arm']}/{summary['phase']}@{summary['concurrency']} rep {summary['repetition']}"
        if in_flight < wanted:
            problems.append(said(gettext_noop("%(where)s: at most %(n)s requests in flight, not %(wanted)s: the client "
                                              "was the bottleneck"), where=where, n=in_flight, wanted=wanted))
        cpu, duration = summary.get("client_cpu_s"), summary.get("duration_s")
        if cpu is not None and duration and cpu / duration >= CLIENT_CPU_MAX:
            problems.append(said(gettext_noop("%(where)s: the client used %(share)s of a core for %(s)s s; it was the "
                                              "bottleneck"), where=where, share=f"{cpu / duration:.0%}",
                                 s=f"{duration:.1f}"))
    detail = (said(gettext_noop("the client kept the planned concurrency in flight (%(n)s phase summaries)"), n=checked)
              if checked else said(gettext_noop("not checked: no phase summary reports max_in_flight")))
    return _check("client-not-bottleneck", problems, detail)


def _lateness(summary: dict) -> str:
    """The lateness figures an open-loop summary carries (keys with "late" in their name, flat or one level down)."""
    parts = []
    for key in sorted(summary):
        value = summary[key]
        if "late" not in key and key != "schedule":   # the soak's own verdict: schedule {lateness_p99_s, …}
            continue
        if isinstance(value, dict):
            parts += [f"{key}.{k} {plain(v)}" for k, v in sorted(value.items())
                      if isinstance(v, (int, float, str)) and not isinstance(v, bool)]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            parts.append(f"{key} {plain(value)}")
    return ", ".join(parts) or "no lateness figures recorded"


def _schedule_kept(inputs: Inputs) -> dict:
    """An open-loop phase (issue 45: the soak sent at a planned rate) is measured from each request's scheduled
    time; a client that could not keep its schedule sent less than planned, and its latencies say nothing of the
    server: invalid with the lateness figures, never judged."""
    problems, kept = [], 0
    behind: dict[tuple, list[dict]] = {}
    for summary in inputs.summaries:
        if "schedule_kept" not in summary:
            continue
        if summary["schedule_kept"] is True:
            kept += 1
            continue
        # one soak's verdict on its own client (`schedule`) is said once for all its windows
        key = (summary["arm"], summary["phase"], summary["concurrency"], summary.get("run_id"), summary.get("instance"),
               repr(summary.get("schedule")), repr(summary["schedule_kept"]))
        behind.setdefault(key, []).append(summary)
    for group in behind.values():
        first = group[0]
        reps = sorted(int(s["repetition"]) for s in group)
        where = f"{first['arm']}/{first['phase']}@{first['concurrency']} " + (
            f"rep {reps[0]}" if len(reps) == 1 else f"windows {_ranges(reps)}")
        lateness = _lateness(first) if len(group) == 1 else _lateness({"schedule": first.get("schedule")}) \
            if isinstance(first.get("schedule"), dict) else _lateness(first)
        problems.append(said(gettext_noop("%(where)s: the client did not keep its open-loop schedule "
                                          "(schedule_kept: %(value)s; %(lateness)s): the window is not judged"),
                             where=where, value=plain(first["schedule_kept"]), lateness=lateness))
    return _check("schedule-kept", problems[:10] + ([said(gettext_noop("%(n)s more"), n=len(problems) - 10)]
                                                    if len(problems) > 10 else []),
                  said(gettext_noop("the client kept its open-loop schedule in %(n)s phase summaries"), n=kept))


def _hashes(gate: GatePlan, requests: pd.DataFrame, frame: pd.DataFrame) -> dict:
    problems = []
    for spec in gate.criteria:
        if spec.metric != "output_match":
            continue
        for arm in (spec.candidate, spec.baseline):
            rows = select(frame, arm, spec.phase)
            rows = rows[rows["ok"]]
            if len(rows) and requests.loc[rows.index, "output_sha256"].isna().all():
                problems.append(said(gettext_noop("%(criterion)s: arm %(arm)s records carry no output_sha256 in phase "
                                                  "%(phase)s"), criterion=spec.key, arm=repr(arm), phase=repr(spec.phase)))
    return _check("output-hashes-present", problems, said(gettext_noop("probe outputs carry output_sha256")))



def _other_instance(requests: pd.DataFrame) -> dict:
    """Cross-instance sharing proves something only when instance B reads what instance A wrote."""
    share = requests[requests["phase"] == "share"]
    written = requests[requests["phase"] == "populate"]
    if len(written) == 0 or len(share) == 0:
        return _check("share-read-on-another-instance", [], said(gettext_noop("not checked: no populate records to say which "
                                                                    "instance wrote the shared sessions")))
    writers = written.groupby("session", observed=True)["instance"].agg(lambda s: set(s.astype(str)))
    same = [session for session, instance in zip(share["session"], share["instance"].astype(str), strict=True)
            if session in writers.index and instance in writers[session]]
    problems = [said(gettext_noop("%(n)s share-phase request(s) were answered by the instance that wrote the session "
                                  "(e.g. %(session)s)"), n=len(same), session=same[0])] if same else []
    return _check("share-read-on-another-instance", problems,
                  said(gettext_noop("every shared session was read on another instance")))


SHARE_WRITE_PHASES = ("populate", "share")  # instance A writes the shared sessions, instance B reads them


def _chunk_hash(gate: GatePlan, inputs: Inputs, expect: dict | None = None) -> dict:
    """Instances sharing one pool find each other's chunks only if they hash tokens alike. Judged on what the
    processes OBSERVED (issue 43, item 6): every process's `NONE_HASH` (versions.none_hash.observed, collected by the
    deploy at /health) is one value on every process and instance, equal to the one computed from the stated
    algorithm and seed (versions.none_hash.expected); LMCache's fingerprint (versions.lmcache_fingerprint) is the
    same on every instance and, when the plan names one (expect.lmcache_fingerprint), that one. The stated chunk
    hash (versions.chunk_hash: LMCache's pre_caching_hash_algorithm and PYTHONHASHSEED) must still be a fixed,
    common one: without a seed, vLLM draws the first block's hash at random per process and LMCache's `builtin`
    is Python's salted hash(). A mismatch is invalid with both values, never a tier fail."""
    arms = {spec.candidate for spec in gate.criteria if spec.phase == "share" and spec.candidate}
    rows = [s for s in inputs.summaries if s["phase"] in SHARE_WRITE_PHASES and (not arms or s["arm"] in arms)
            and not summary_simulated(s)]
    if not rows:
        return _check("chunk-hash-shared", [], said(gettext_noop("no real populate or share phase to check")))
    problems, found, observed = [], {}, {}
    for summary in rows:
        instance = summary.get("instance") or "an unnamed instance"
        where = f"{summary['arm']} {summary['phase']} on {instance}"
        versions = summary.get("versions") or {}
        stated = versions.get("chunk_hash")
        if not isinstance(stated, dict) or not stated.get("algorithm"):
            problems.append(said(gettext_noop("%(where)s: no chunk hash recorded (versions.chunk_hash from the deploy "
                                              "manifest), so whether the instances hash alike cannot be verified"),
                                 where=where))
        else:
            seed = stated.get("pythonhashseed")
            if seed in (None, "", "random"):
                problems.append(said(gettext_noop("%(where)s: %(algorithm)s without a fixed PYTHONHASHSEED hashes "
                                                  "differently in every process"), where=where,
                                     algorithm=stated["algorithm"]))
            else:
                found.setdefault(f"{stated['algorithm']} with PYTHONHASHSEED={seed}", []).append(where)
        none_hash = versions.get("none_hash")
        seen_values = [o for o in (none_hash.get("observed") or []) if isinstance(o, dict)] \
            if isinstance(none_hash, dict) and isinstance(none_hash.get("observed"), list) else []
        if not seen_values:
            problems.append(said(gettext_noop("%(where)s: cannot be verified: no process's NONE_HASH was observed "
                                              "(versions.none_hash.observed, collected by the deploy at /health)"),
                                 where=where))
            continue
        values = sorted({str(o.get("value")) for o in seen_values})
        if len(values) > 1:
            problems.append(said(gettext_noop("%(where)s: its processes logged different NONE_HASH values: %(values)s"),
                                 where=where, values="; ".join(
                                     f"{v} ({', '.join(sorted(str(o.get('process')) for o in seen_values if str(o.get('value')) == v)[:3])})"
                                     for v in values)))
        expected = none_hash.get("expected")
        for value in values:
            if expected and value != str(expected):
                problems.append(said(gettext_noop("%(where)s: observed NONE_HASH %(observed)s, expected %(expected)s "
                                                  "(from the stated algorithm and seed)"), where=where,
                                     observed=value, expected=expected))
            observed.setdefault(value, set()).add(instance)
    if len(found) > 1:
        problems.append(said(gettext_noop("the instances hash differently: %(hashes)s"),
                             hashes="; ".join(f"{value} ({', '.join(sorted(set(wheres))[:3])})"
                                              for value, wheres in sorted(found.items()))))
    if len(observed) > 1:
        problems.append(said(gettext_noop("the instances observed different NONE_HASH values: %(values)s"),
                             values="; ".join(f"{v} ({', '.join(sorted(i)[:3])})" for v, i in sorted(observed.items()))))
    problems += fingerprint_problems(rows, expect, require=False)
    if problems:
        return _check("chunk-hash-shared", problems, [])
    detail = [said(gettext_noop("every instance ran %(hash)s"), hash=next(iter(found)))] if len(found) == 1 else []
    if len(observed) == 1:
        detail.append(said(gettext_noop("every process observed NONE_HASH %(value)s"), value=next(iter(observed))))
    return _check("chunk-hash-shared", [], detail or said(gettext_noop("no chunk hash to compare")))


def _fingerprint_of(summary: dict) -> str | None:
    value = (summary.get("versions") or {}).get("lmcache_fingerprint")
    if isinstance(value, dict):
        value = value.get("sha256")
    return str(value) if value else None


def expected_fingerprint(expect: dict | None) -> str | None:
    value = (expect or {}).get("lmcache_fingerprint")
    if isinstance(value, dict):
        value = value.get("sha256")
    return str(value) if value else None


def fingerprint_problems(rows: list[dict], expect: dict | None, *, require: bool) -> list[Said]:
    """LMCache's fingerprint (versions.lmcache_fingerprint.sha256, per instance) equal on every instance and to the
    plan's expected one when named (expect.lmcache_fingerprint): a differing build is a wrong deployment, never a
    tier fail. `require`: a missing fingerprint is a problem even when no instance records one."""
    wanted = expected_fingerprint(expect)
    per_instance: dict[str, set[str]] = {}
    missing = []
    for summary in rows:
        instance = str(summary.get("instance") or summary.get("_source") or "an unnamed instance")
        value = _fingerprint_of(summary)
        if value is None:
            missing.append(f"{summary['arm']}/{summary['phase']} on {instance}")
        else:
            per_instance.setdefault(instance, set()).add(value)
    problems: list[Said] = []
    if missing and (per_instance or require or wanted):
        problems.append(said(gettext_noop("cannot be verified: no LMCache fingerprint recorded "
                                          "(versions.lmcache_fingerprint) for %(where)s"),
                             where=", ".join(sorted(set(missing))[:3]) + (f" and {len(set(missing)) - 3} more"
                                                                          if len(set(missing)) > 3 else "")))
    values = sorted({v for vs in per_instance.values() for v in vs})
    if len(values) > 1:
        problems.append(said(gettext_noop("the instances run different LMCache builds: %(values)s"),
                             values="; ".join(f"{v[:16]} ({', '.join(sorted(i for i, vs in per_instance.items() if v in vs)[:3])})"
                                              for v in values)))
    if wanted:
        for value in values:
            if value != wanted:
                problems.append(said(gettext_noop("LMCache fingerprint %(observed)s on %(instances)s, but the plan "
                                                  "names %(expected)s (expect.lmcache_fingerprint): not the build "
                                                  "the parties signed for"), observed=value,
                                     instances=", ".join(sorted(i for i, vs in per_instance.items() if value in vs)[:3]),
                                     expected=wanted))
    return problems


def _fingerprint(gate: GatePlan, inputs: Inputs, expect: dict | None) -> dict:
    """Every real LMCache arm the gate measures ran one LMCache build on every instance, the plan's when it names
    one (issue 43, item 4)."""
    arms = {a for s in gate.criteria for a in (s.candidate, s.baseline) if a and a != RECOMPUTE_ARM}
    rows = [s for s in inputs.summaries if s["arm"] in arms and not summary_simulated(s)]
    if not rows:
        return _check("lmcache-fingerprint", [], said(gettext_noop("no real LMCache arm to check")))
    problems = fingerprint_problems(rows, expect, require=False)
    values = sorted({v for v in (_fingerprint_of(s) for s in rows) if v})
    detail = said(gettext_noop("one LMCache build on every instance: %(value)s"), value=values[0]) if values else \
        said(gettext_noop("no LMCache fingerprint recorded and the plan names none"))
    return _check("lmcache-fingerprint", problems, detail)


FAULT_SENTENCES = {
    ("cut", "none"): gettext_noop("%(where)s: no cut command ran (no cut_exit): the FX path was not cut"),
    ("cut", "exit"): gettext_noop("%(where)s: the cut command exited %(code)s: the FX path was not cut"),
    ("cut", "error"): gettext_noop("%(where)s: the cut command exited %(code)s (%(error)s): the FX path was not cut"),
    ("restore", "none"): gettext_noop("%(where)s: no restore command ran (no restore_exit): the FX path was not "
                                      "restored"),
    ("restore", "exit"): gettext_noop("%(where)s: the restore command exited %(code)s: the FX path was not restored"),
    ("restore", "error"): gettext_noop("%(where)s: the restore command exited %(code)s (%(error)s): the FX path was "
                                       "not restored"),
}


def _fault_cut(gate: GatePlan, inputs: Inputs) -> dict:
    """A fault window proves something only if the path was cut and restored, and HBM emptied after the restore:
    a cut refused for want of root (`RTNETLINK answers: Operation not permitted`) leaves the path up, and
    "keeps answering during the cut" would then be measured on a path that never went down."""
    arms = {s.candidate for s in gate.criteria if s.phase in FAULT_PHASES}
    events: dict[str, tuple[dict, dict]] = {}
    for summary in inputs.summaries:
        if summary["arm"] in arms and summary["phase"] in FAULT_PHASES and isinstance(summary.get("fault"), dict):
            key = f"{summary.get('run_id')}/{summary.get('instance')}/{summary.get('metrics_window')}"
            events.setdefault(key, (summary, summary["fault"]))
    if not events:
        return _check("fault-path-cut-confirmed", [said(gettext_noop(
            "no phase summary of %(arms)s in phase fault or recovery records the path cut (its 'fault' field): the cut "
            "cannot be confirmed"), arms=", ".join(sorted(arms)))], [])
    problems, seen = [], []
    for summary, fault in events.values():
        where = f"{summary['arm']} on {summary.get('instance') or summary.get('_source')}"
        before = len(problems)
        for step in ("cut", "restore"):
            code = fault.get(f"{step}_exit")
            error = fault.get(f"{step}_error")
            if code is None:
                problems.append(said(FAULT_SENTENCES[step, "none"], where=where))
            elif code != 0:
                problems.append(said(FAULT_SENTENCES[step, "error" if error else "exit"], where=where, code=code,
                                     error=error))
        eviction = fault.get("eviction")
        if not isinstance(eviction, dict) or not eviction:
            problems.append(said(gettext_noop("%(where)s: no eviction after the restore, so hits after it may be HBM's"),
                                 where=where))
        elif eviction.get("error"):
            problems.append(said(gettext_noop("%(where)s: the eviction after the restore failed (%(error)s), so hits "
                                              "after it may be HBM's"), where=where, error=eviction["error"]))
        if len(problems) == before:
            seen.append(said(gettext_noop("%(arm)s on %(where)s: cut and restore exited 0, evicted after the restore"),
                             arm=summary["arm"], where=summary.get("instance") or summary.get("_source")))
    return _check("fault-path-cut-confirmed", problems, seen)


def _external_hits(gate: GatePlan, inputs: Inputs) -> dict:
    """An external-tier hit ratio comes from /metrics alone: without its window's counters there is nothing."""
    problems, seen = [], []
    for spec in gate.criteria:
        if spec.metric != "external_hit_ratio":
            continue
        _external_windows(spec, inputs, problems, seen)
    return _check("external-hits-measured", problems, seen)


def _external_windows(spec: CriterionSpec, inputs: Inputs, problems: list, seen: list) -> None:
    """The /metrics windows with external-hit deltas of a criterion's candidate and phase: counted in `seen`, or
    their absence in `problems` (an external-tier share comes from those counters alone)."""
    rows = [s for s in inputs.summaries if s["arm"] == spec.candidate
            and (spec.phase == "any" or s["phase"] == spec.phase)]
    measured = [s for s in rows if counters.external_hits(s, inputs.summaries) is not None]
    if not measured:
        problems.append(said(gettext_noop("%(criterion)s: cannot be verified: no /metrics for %(cell)s (no phase "
                                          "summary with its own vllm:external_prefix_cache_hits_total and "
                                          "vllm:external_prefix_cache_queries_total deltas)"),
                             criterion=spec.key, cell=f"{spec.candidate}/{spec.phase}"))
    else:
        seen.append(said(gettext_noop("%(criterion)s: %(n)s /metrics window(s)"), criterion=spec.key, n=len(measured)))


def bandwidth_retrievals(retrieves: pd.DataFrame, arm: str | None) -> pd.DataFrame:
    """The retrievals read_bw is measured from: of the arm (every arm when None), logged with a bandwidth, and
    served by the arm's own tier (`tier` == the arm: `fx` for the FX arm). LMCache names no tier in its
    retrieval lines, so `tier` is set only when the arm's configuration left no other tier to answer."""
    rows = retrieves if arm is None else retrieves[retrieves["arm"] == arm]
    if len(rows) == 0:
        return rows
    logged = rows["bandwidth_logged"].fillna(False).astype(bool) & rows["gbps"].notna()
    own = rows["tier"].fillna("").astype(str) == rows["arm"].astype(str)
    return rows[logged & own]


def _read_bw_measured(gate: GatePlan, inputs: Inputs) -> dict:
    """read_bw is a bandwidth of the candidate's own tier: LMCache lines without one (LMCache 0.3.1–0.3.3,
    use_layerwise) or retrievals no one can attribute to that tier leave it unmeasured, never passed."""
    problems: list[Said] = []
    seen: list[Said] = []
    for spec in gate.criteria:
        if spec.metric != "read_bw":
            continue
        retrieves = inputs.retrieves
        rows = retrieves if not spec.candidate else retrieves[retrieves["arm"] == spec.candidate]
        if len(rows) == 0:
            continue  # require_inputs refuses the run before this
        arm = spec.candidate or "every arm"
        logged = rows[rows["bandwidth_logged"].fillna(False).astype(bool) & rows["gbps"].notna()]
        used = bandwidth_retrievals(retrieves, spec.candidate or None)
        if len(logged) == 0:
            problems.append(said(gettext_noop("%(criterion)s: this LMCache version logs no bandwidth: %(n)s retrieval "
                                              "line(s) of %(arm)s carry tokens but no size, cost or throughput "
                                              "(LMCache 0.3.1–0.3.3, or use_layerwise: true)"),
                                 criterion=spec.key, n=len(rows), arm=arm))
        elif len(used) == 0:
            problems.append(said(gettext_noop("%(criterion)s: none of the %(n)s retrievals of %(arm)s can be "
                                              "attributed to its own tier: LMCache's retrieval lines name no tier, "
                                              "and only a configuration that leaves no other tier to answer (no "
                                              "local_cpu) or the device counters of cold windows that began with "
                                              "LMCache's DRAM emptied attribute them (read_bw_attribution)"),
                                 criterion=spec.key, n=len(logged), arm=arm))
        else:
            seen.append(said(gettext_noop("%(criterion)s: %(n)s of %(total)s retrievals of %(arm)s logged with a "
                                          "bandwidth and served by its own tier"),
                             criterion=spec.key, n=len(used), total=len(rows), arm=arm))
    return _check("read-bw-measured", problems, seen or said(gettext_noop("no read_bw criterion")))


def _instances_unverified(arm: str, phase: str, instances_of_rows: pd.Series, summaries: list[dict]) -> list[Said]:
    """Every instance (node:port) of a cache arm shows its own /metrics counters: one node's counters never
    vouch for another's server (issue 28). cached_tokens count GPU prefix-cache hits too, so without an
    instance's /metrics nothing shows its HBM was cold and its hits came from the tier."""
    def measured(group: list[dict]) -> bool:
        return any(_delta(s, "vllm:prompt_tokens_total") is not None for s in group) and \
            any(_delta(s, "vllm:prefix_cache_hits_total") is not None for s in group)

    instances = sorted({str(i) for i in instances_of_rows.dropna().unique() if str(i)}
                       | {str(s["instance"]) for s in summaries if s.get("instance")})
    if len(instances) <= 1:  # one server: its summaries are its own, labelled or not
        return [] if measured(summaries) else [said(gettext_noop(
            "%(where)s: cannot be verified: no /metrics (no phase summary with vllm:prompt_tokens_total and "
            "vllm:prefix_cache_hits_total deltas), so nothing shows the GPU prefix cache was cold and the hits came "
            "from the tier"), where=f"{arm}/{phase}")]
    return [said(gettext_noop("%(where)s on node %(node)s (instance %(instance)s): cannot be verified: no /metrics of "
                              "its own (no phase summary of that instance with vllm:prompt_tokens_total and "
                              "vllm:prefix_cache_hits_total deltas; another node's counters do not count for it), so "
                              "nothing shows its GPU prefix cache was cold and its hits came from the tier"),
                 where=f"{arm}/{phase}", node=instance.rsplit(":", 1)[0], instance=instance)
            for instance in instances if not measured([s for s in summaries if str(s.get("instance") or "") == instance])]


# ---- completeness, near-copies, clocks (judge version 3) ----

def main_cells(gate: GatePlan, frame: pd.DataFrame, phase: str) -> dict[tuple[str, int], list[int]]:
    """(arm, concurrency) → the repetitions with records, for every cell of the gate's main phase a criterion
    judges (candidate and baseline arms, each level)."""
    out: dict[tuple[str, int], list[int]] = {}
    rows = frame[frame["phase"] == phase]
    for spec in gate.criteria:
        if not uses_requests(spec) or spec.metric == "output_match" or spec.phase not in (phase, "any"):
            continue
        for arm in (a for a in (spec.candidate, spec.baseline) if a):
            mine = rows[rows["arm"] == arm]
            for level in (spec.concurrency or sorted(int(c) for c in mine["concurrency"].unique())):
                reps = sorted(int(r) for r in mine.loc[mine["concurrency"] == level, "repetition"].unique())
                out[(arm, int(level))] = reps
    return out


def _ranges(values: list[int]) -> str:
    parts, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(f"{start}" if start == v else f"{start}–{v}")
            start = None
    return ", ".join(parts)


def completeness(gate: GatePlan, frame: pd.DataFrame, summaries: list[dict], looks: tuple[int, ...], phase: str, *,
                 planned: int | None = None) -> dict:
    """Every planned repetition × concurrency × arm up to the look the records reach is there, and every phase
    summary of the main phase has its records (a repetition measured and then left out shows as a summary
    without records). A partial run is judged as the look it reaches, never as the whole plan; records that
    reach no look are invalid, naming what is missing."""
    cells = main_cells(gate, frame, phase)
    if not cells:
        return _check("repetitions-complete", [], said(gettext_noop("no repeated cell to check")))
    most = max((max(r) for r in cells.values() if r), default=0)
    reached = [r for r in looks if all(len(reps) >= r for reps in cells.values())]
    judged = reached[-1] if reached else looks[0]
    problems = []
    for (arm, level), reps in sorted(cells.items()):
        wanted = list(range(1, max(judged, most if not reached else judged) + 1))
        missing = [r for r in wanted if r not in reps]
        if missing and (not reached or any(r <= judged for r in missing)):
            problems.append(said(gettext_noop("%(cell)s lacks repetition(s) %(reps)s of %(phase)s"), cell=f"{arm}@{level}",
                                 reps=_ranges(missing), phase=phase))
    if not reached:
        problems.insert(0, said(gettext_noop("look 1 of the design needs %(n)s repetitions of every cell (looks: %(looks)s); "
                                   "the records reach none"), n=looks[0], looks=", ".join(map(str, looks))))
    have = {(str(a), int(c), int(r)) for a, c, r in frame.loc[frame["phase"] == phase,
                                                               ["arm", "concurrency", "repetition"]].itertuples(index=False)}
    orphans = sorted({(s["arm"], int(s["concurrency"]), int(s["repetition"])) for s in summaries
                      if s["phase"] == phase and (s["arm"], int(s["concurrency"])) in cells
                      and (s["arm"], int(s["concurrency"]), int(s["repetition"])) not in have})
    if orphans:
        listed = "; ".join(f"{a}@{c} rep {r}" for a, c, r in orphans[:5])
        problems.append(said(gettext_noop("%(n)s measured repetition(s) have a phase summary but no records: %(listed)s"),
                             n=len(orphans), listed=listed))
        if len(orphans) > 5:
            problems.append(said(gettext_noop("%(n)s more"), n=len(orphans) - 5))
    later = [f"{a}@{c}: {len(r)}" for (a, c), r in sorted(cells.items()) if len(r) > judged]
    detail = [said(gettext_noop("every cell holds repetitions 1–%(r)s (look %(look)s of %(looks)s)"), r=judged,
                   look=reached.index(judged) + 1 if reached else 0, looks=len(looks))]
    if later:
        detail.append(said(gettext_noop("repetitions beyond %(r)s wait for the next look (%(cells)s)"), r=judged,
                           cells=", ".join(later[:3])))
    if planned and reached and judged < planned:
        detail.append(said(gettext_noop("the run planned %(n)s: this is an interim look"), n=planned))
    return _check("repetitions-complete", problems, detail)


def near_copies(gate: GatePlan, frame: pd.DataFrame, requests: pd.DataFrame, tolerance: float,
                summaries: list[dict] | None = None) -> dict:
    """A repetition whose requests' timings (TTFTs and durations, sorted) all match another repetition's of the
    same arm, phase and concurrency within `tolerance` seconds is a copy, however it was shifted or relabelled:
    two real closed-loop repetitions never agree request for request to a millisecond. Arms served by the
    simulator (its /metrics carry its gauge) are not compared: its model clock is deterministic, so its
    repetitions of the same load agree exactly by design (docs/simulator.md)."""
    ok = frame[frame["ok"]]
    modelled = sorted({s["arm"] for s in summaries or [] if any(
        SIMULATOR_GAUGE in (s.get(key) or {}) for key in ("metrics_before", "metrics_after"))})
    problems = []
    for (arm, phase, level), cell in ok.groupby(["arm", "phase", "concurrency"], sort=True, observed=True):
        if arm in modelled:
            continue
        prints: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for rep, sub in cell.groupby("repetition", sort=True, observed=True):
            prints[int(rep)] = (np.sort(sub["ttft"].to_numpy(dtype=np.float64)),
                                np.sort((sub["t_end"] - sub["t_send"]).to_numpy(dtype=np.float64)))
        reps = sorted(prints)
        by_size: dict[int, list[int]] = {}
        for rep in reps:
            by_size.setdefault(len(prints[rep][0]), []).append(rep)
        for size, same in by_size.items():
            if size < 2:
                continue
            for i, a in enumerate(same):
                for b in same[i + 1:]:
                    (ta, da), (tb, db) = prints[a], prints[b]
                    if np.max(np.abs(ta - tb)) <= tolerance and np.max(np.abs(da - db)) <= tolerance:
                        problems.append(said(gettext_noop("%(cell)s: repetition %(b)s repeats repetition %(a)s's timings "
                                                "within %(s)s s (all %(n)s requests)"), cell=f"{arm}/{phase}@{level}",
                                             a=a, b=b, s=f"{tolerance:g}", n=size))
    detail = [said(gettext_noop("no repetition repeats another's timings within %(s)s s"), s=f"{tolerance:g}")]
    if modelled:
        detail.append(said(gettext_noop("not compared on the simulator's deterministic model clock: %(arms)s"),
                           arms=", ".join(modelled)))
    return _check("no-copied-repetitions",
                  problems[:10] + ([said(gettext_noop("%(n)s more"), n=len(problems) - 10)] if len(problems) > 10 else []), detail)


def clocks(requests: pd.DataFrame, summaries: list[dict], tolerance: float) -> dict:
    """Instances whose clocks disagree with the collector's beyond `tolerance` seconds: a phase summary's
    `clock_offset_s` (collector − instance, measured by the client) when recorded, and, within every cell whose
    requests went to several instances from several clients (wall anchors), each instance's first send on the wall
    clock (wall_anchor + t_send) against the cell's other instances (a closed-loop cell starts its clients
    together). One client sending to several instances is not compared: its one clock orders its own sends."""
    problems, checked = [], 0
    for summary in summaries:
        offset = summary.get("clock_offset_s")
        if isinstance(offset, (int, float)) and not isinstance(offset, bool):
            checked += 1
            if abs(offset) > tolerance:
                problems.append(said(gettext_noop("instance %(instance)s: its clock is %(offset)s s from the collector's "
                                        "(tolerance %(s)s s)"), instance=summary.get("instance") or summary.get("_source"),
                                     offset=f"{offset:+.3g}", s=f"{tolerance:g}"))
    # a populate phase is a warm-up whose timings no criterion reads, and G4 populates one cell from two steps
    # minutes apart (the share test through A, the fault step's own warm-up on B): not compared
    rows = requests[(requests["wall_anchor"] > 0) & ~requests["phase"].isin(("replay", "populate"))]
    if len(rows) and rows["instance"].nunique() > 1:
        wall = rows["wall_anchor"] + rows["t_send"]
        keyed = rows.assign(_wall=wall)
        for (arm, phase, level, rep), cell in keyed.groupby(["arm", "phase", "concurrency", "repetition"],
                                                            sort=True, observed=True):
            starts = cell.groupby("instance", observed=True)["_wall"].min()
            if len(starts) < 2 or cell["wall_anchor"].nunique() < 2:
                # one client (one wall anchor) sent to every instance of the cell: when it turned to each is its
                # own schedule (G4's sharing test writes through A, then reads through B), not a clock
                continue
            checked += 1
            centre = float(np.median(starts.to_numpy()))
            for instance, start in starts.items():
                if abs(float(start) - centre) > tolerance:
                    problems.append(said(gettext_noop("instance %(instance)s: %(cell)s rep %(rep)s started %(offset)s s from "
                                            "the cell's other instances on the wall clock (tolerance %(s)s s): its "
                                            "clock disagrees"), instance=instance, cell=f"{arm}/{phase}@{level}",
                                         rep=rep, offset=f"{float(start) - centre:+.3g}", s=f"{tolerance:g}"))
    unique = [p for i, p in enumerate(problems) if p not in problems[:i]]
    return _check("clocks-agree", unique[:10],
                  said(gettext_noop("clocks agree within %(s)s s (%(n)s comparison(s))"), s=f"{tolerance:g}", n=checked)
                  if checked else said(gettext_noop("not checked: no clock offsets recorded and no cell measured on several "
                                          "instances")))


def replay_reached_reuse(gate: GatePlan, inputs: Inputs, frame: pd.DataFrame, oracle: dict | None, plan) -> dict:
    """The replay reached ≥ the plan's share (`workloads.replay.fidelity_share`, 0.8) of the reuse its trace allows
    (issue 24, item 4): per cache arm of the gate's replay criteria, the prompt tokens served from any cache per
    repetition — by the server's /metrics (GPU prefix-cache + KV-connector hits of the replay's phase summaries)
    when it recorded them, else by the records' cached tokens — against the oracle's unbounded-cache hit tokens for
    exactly the requests replayed (runners.tracereplay.oracle). A replay that missed its trace's reuse (prompts not
    built from the trace's blocks, a broken chunk hash, a replay sped past its prefills) measures nothing of the
    tier. Traffic with little reuse has nothing to reach: it passes saying so.

    Bounded above too (issue 44, item 2): a repetition whose caches served more than the trace allows by over
    `workloads.replay.fidelity_ceiling_tolerance` (0.05 of the allowed tokens) — or whose disk tier alone served
    more than the trace leaves below HBM (device bytes ÷ KV bytes per token, against the allowed tokens less the
    repetition's HBM hits) — is invalid: a tier served reuse the traffic does not have (a repetition warm from an
    earlier one, another reader of the device), so it measures nothing of FX on this traffic."""
    replay_settings = plan.workloads.get("replay") or {}
    share = float(replay_settings.get("fidelity_share", FIDELITY_SHARE))
    ceiling = float(replay_settings.get("fidelity_ceiling_tolerance", FIDELITY_CEILING_TOLERANCE))
    if oracle is None:
        return _check("replay-reached-trace-reuse", [], said(gettext_noop(
            "not checked: no oracle of the replayed requests (a trace without block reuse information, or a run "
            "whose replay step kept none)")))
    allowed = float(oracle.get("ideal_hit_tokens") or 0)
    ideal = float(oracle.get("ideal_hit_fraction") or 0.0)
    if ideal < LITTLE_REUSE or allowed <= 0:
        return _check("replay-reached-trace-reuse", [], said(gettext_noop(
            "this traffic has little reuse: at most %(share)s of its prompt tokens could ever come from a cache, so "
            "there is little for the replay to reach (the traffic, not an FX failure)"), share=f"{100 * ideal:.1f} %"))
    problems, seen = [], []
    arms = sorted({spec.candidate for spec in gate.criteria if spec.phase == "replay" and spec.candidate
                   and spec.candidate != RECOMPUTE_ARM})
    for arm in arms:
        summaries = [s for s in inputs.summaries if s["arm"] == arm and s["phase"] == "replay"]
        per_rep: dict[int, float] = {}
        source = "/metrics"
        for summary in summaries:
            hits = counters.metrics_hits(summary)
            if hits is None:
                per_rep = {}
                break
            per_rep[int(summary["repetition"])] = per_rep.get(int(summary["repetition"]), 0.0) + hits
        if not per_rep:
            source = "records"
            rows = select(frame, arm, "replay")
            rows = rows[rows["ok"]]
            per_rep = {int(rep): float(sub["cached_tokens"].fillna(0).sum())
                       for rep, sub in rows.groupby("repetition", sort=True)}
        if not per_rep:
            problems.append(said(gettext_noop("%(arm)s replayed no request: the reuse it reached cannot be told"),
                                 arm=arm))
            continue
        reached = sum(per_rep.values()) / len(per_rep) / allowed
        values = dict(arm=arm, reached=f"{100 * reached:.1f} %", share=f"{100 * share:g} %", source=source,
                      allowed=f"{int(allowed):,}")
        above = _reuse_ceiling(arm, summaries if source == "/metrics" else [], per_rep, allowed, ceiling, source)
        if above:
            problems.extend(above)
        elif reached + 1e-9 < share:
            problems.append(said(gettext_noop(
                "%(arm)s reached %(reached)s of the %(allowed)s prompt tokens its trace lets a cache serve "
                "(%(source)s), below the plan's %(share)s: the replay did not reproduce its trace's reuse, so it "
                "measures nothing of the tier"), **values))
        else:
            seen.append(said(gettext_noop("%(arm)s reached %(reached)s of the %(allowed)s prompt tokens its trace lets "
                                          "a cache serve (%(source)s; the plan asks %(share)s)"), **values))
    return _check("replay-reached-trace-reuse", problems, seen or said(gettext_noop("no cache arm is replayed")))


def _reuse_ceiling(arm: str, summaries: list[dict], per_rep: dict[int, float], allowed: float, tolerance: float,
                   source: str) -> list[dict]:
    """The fidelity check's upper bound (issue 44, item 2), per repetition: every cache together, and the disk tier
    alone where the phase summaries carry its device bytes (gates.judge.tiers)."""
    problems = []
    for rep, hits in sorted(per_rep.items()):
        if hits > (1 + tolerance) * allowed + 1e-9:
            problems.append(said(gettext_noop(
                "%(arm)s repetition %(rep)s: the caches served %(reached)s of the %(allowed)s prompt tokens its trace "
                "lets a cache serve (%(source)s), more than the trace allows by over %(tolerance)s: a tier served "
                "reuse the traffic does not have (a repetition warm from an earlier one, or another reader), so it "
                "measures nothing of the tier on this traffic"), arm=arm, rep=rep,
                reached=f"{100 * hits / allowed:.1f} %", allowed=f"{int(allowed):,}", source=source,
                tolerance=f"{100 * tolerance:g} %"))
            continue
        disk = hbm = 0.0
        complete = False
        for summary in (s for s in summaries if int(s["repetition"]) == rep):
            read, _, why = tiers.device_bytes(summary)
            per_token, _ = tiers.kv_bytes_per_token(summary)
            gpu = counters._delta(summary.get("metrics_before") or {}, summary.get("metrics_after") or {},
                                  counters.GPU_HITS)
            if why or not per_token or gpu is None:
                complete = False
                break
            disk, hbm, complete = disk + read / per_token, hbm + gpu, True
        if complete and disk > allowed - hbm + tolerance * allowed + 1e-9:
            problems.append(said(gettext_noop(
                "%(arm)s repetition %(rep)s: its disk tier served %(disk)s prompt tokens (device bytes ÷ KV bytes per "
                "token), more than the %(left)s the trace leaves below HBM (%(allowed)s allowed, %(hbm)s served by "
                "HBM) by over %(tolerance)s of the allowed: the tier served reuse the traffic does not have"),
                arm=arm, rep=rep, disk=f"{int(disk):,}", left=f"{int(max(allowed - hbm, 0)):,}",
                allowed=f"{int(allowed):,}", hbm=f"{int(hbm):,}", tolerance=f"{100 * tolerance:g} %"))
    return problems


def capacity_measured(gate: GatePlan, inputs: Inputs, oracle: dict | None) -> dict:
    """G4's capacity check has what it compares: the oracle's prediction for the cap (the replay-sample) and the
    capped replay's /metrics (its phase summaries' external-hit deltas). Traffic whose reuse is little or unknown has
    no prediction to check: the criterion says so (marginal, never fail) and this check passes."""
    problems, seen = [], []
    for spec in gate.criteria:
        if spec.metric != "capacity_agreement":
            continue
        check = (oracle or {}).get("capacity_check") or {}
        if oracle is not None and not check:
            problems.append(said(gettext_noop("%(criterion)s: cannot be verified: the replay's oracle has no "
                                              "prediction for a capped tier"), criterion=spec.key))
            continue
        if not check.get("applicable"):
            seen.append(said(gettext_noop("%(criterion)s: not applicable: the replayed traffic's reuse is little or "
                                          "unknown"), criterion=spec.key))
            continue
        _external_windows(spec, inputs, problems, seen)
        _capacity_order_said(spec, capacity_order(spec, inputs, check), check, problems, seen)
    return _check("capacity-check-measured", problems, seen)


def capacity_order(spec: CriterionSpec, inputs: Inputs, check: dict) -> dict | None:
    """The capped replay's order as its records show it (by `send_seq`, else by send time), matched to the oracle's
    rows by session and turn, and the oracle recomputed on it (gates.traces.capacity.in_order); None when the oracle
    keeps no rows (a replay-sample written before they were)."""
    if not check.get("rows"):
        return None
    rows = select(inputs.requests, spec.candidate, spec.phase)
    if "repetition" in rows.columns and len(rows):
        rows = rows[rows["repetition"] == rows["repetition"].min()]
    if "send_seq" in rows.columns and rows["send_seq"].notna().all() and len(rows):
        ordered, basis = rows.sort_values("send_seq", kind="stable"), "send_seq"
    else:
        ordered = rows.assign(_sent=rows["wall_anchor"] + rows["t_send"]).sort_values("_sent", kind="stable")
        basis = "send time (the records carry no send_seq)"
    turns = ordered["turn"] if "turn" in ordered.columns else pd.Series([None] * len(ordered))
    sent = [(str(s), -1 if pd.isna(t) else int(t)) for s, t in zip(ordered["session"], turns, strict=True)]
    found = trace_capacity.in_order(check, sent)
    found["basis"] = basis
    return found


def _capacity_order_said(spec: CriterionSpec, order: dict | None, check: dict, problems: list, seen: list) -> None:
    if order is None:
        seen.append(said(gettext_noop("%(criterion)s: the order sent is not checked: the replay's oracle keeps no "
                                      "rows to match the records to"), criterion=spec.key))
        return
    values = dict(criterion=spec.key, inverted=f"{order['inverted_pairs']:,}", pairs=f"{order['pairs']:,}",
                  share=f"{100 * order['inverted_share']:.2f} %", tolerance=f"{100 * order['order_tolerance']:g} %",
                  basis=order["basis"])
    if order["unknown_count"] or order["missing"]:
        problems.append(said(gettext_noop(
            "%(criterion)s: the capped replay's records do not match the oracle's requests (%(unknown)s not in it, "
            "e.g. %(example)s; %(missing)s of its requests never sent): the check measured other traffic than it "
            "predicted, so it says nothing of FX's capacity"), criterion=spec.key, unknown=order["unknown_count"],
            example=", ".join(order["unknown"]) or "none", missing=order["missing"]))
    elif not order["faithful"]:
        first = order.get("first_inversion") or ["?", "?"]
        problems.append(said(gettext_noop(
            "%(criterion)s: the capped replay was sent in another order than the oracle's: %(inverted)s of "
            "%(pairs)s request pairs the other way round (%(share)s, tolerance %(tolerance)s; by %(basis)s; first "
            "%(later)s sent after %(earlier)s): it measured other traffic than the oracle predicted, so it says "
            "nothing of FX's capacity"), later=first[1], earlier=first[0], **values))
    else:
        seen.append(said(gettext_noop(
            "%(criterion)s: sent in the oracle's order (%(inverted)s of %(pairs)s request pairs the other way round, "
            "%(share)s, tolerance %(tolerance)s; by %(basis)s); the prediction recomputed on that order"), **values))
