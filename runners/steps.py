"""The kinds of step a gate run is made of, each a thin adapter over the module that does the work.

probe (runners.probe) · deploy, collect, teardown (runners.deploy) · the workload phases, run
detached on the node (runners/remote/workload.py through runners.detached) · evaluate
(runners.evaluation, then gates.consequences and gates.lifecycle). The report step that follows the verdict is
the reports app's kind (reports.steps, registered by ReportsConfig.ready()): the engine reaches it through
the kind registry, and nothing here imports the floor above.

A workload step's remote directory is fixed by its step (`<arm dir>/steps/NN-name`), so a step
resumed after its worker died adopts the process already running there instead of starting a
second one; its records file is fixed the same way, so nothing is written twice.
"""
from __future__ import annotations

import inspect
import json
import shlex

from django.conf import settings

from gates import consequences, judge, lifecycle
from gates.judge import lmcache_log
from gates.models import Evaluation, Gate
from runners import detached, gateplans, lmcache, ssh, tracereplay
from runners.artifacts import ArtifactMismatch, read_artifact, store_bytes
from runners.collect import collect_deployment
from runners.config import DEPLOY_TIME_LIMIT_S
from runners.deploy import deploy_arm
from runners.deployment import DeployError, Deployment, run_id_of, settings_for
from runners.evaluation import PlanTamperedError, evaluate_job
from runners.kinds import Poll, StepContext, StepError, StepFailed, StepKind
from runners.lmcache import GIB, kv_bytes_per_token, lmcache_trouble, lmcache_trouble_message, save_log_checked
from runners.models import Artifact, Job, Node
from runners.probe import ProbeSettingsError, probe_node
from runners.remote import workload as client
from runners.remote.workload import plan_args
from runners.runs import SAMPLE_TRACE_NAME, TRACE_NAME, extend_run
from runners.teardown import teardown_arm

WORKLOAD_COMMANDS = {"populate": "populate", "evict": "evict", "measure": "measure", "probe_prompts": "probe",
                     "replay": "replay", "capacity": "replay", "share": "share", "soak": "soak", "fault": "fault"}
COLD_WINDOW_STEPS = ("populate", "evict", "measure", "probe_prompts", "fault")
"""The steps whose eviction opens a cold window: before it measures, the client empties every cache above the tier
under test — vLLM's prefix cache, then LMCache's DRAM on every process that owns one (--lmcache-api). G4's replay,
capacity check, sharing test and soak keep DRAM warm, as production does."""


def _deployment(ctx: StepContext, seq: int | None = None) -> Deployment:
    deploy = ctx.sibling(seq or ctx.step.params["deploy"])
    data = (deploy.result or {}).get("deployment")
    if not data:
        raise StepError(f"step {deploy.seq} (deploy {deploy.arm}) left no deployment to work with")
    return Deployment.from_dict(data)


def _time_scale(job: Job) -> float:
    return float(job.params.get("time_scale", 1.0))


# ── probe, deploy, collect, teardown ───────────────────────────────────────────────────────────


def run_probe(ctx: StepContext) -> dict:
    params = ctx.job.params
    try:
        inventory = probe_node(ctx.node, job=ctx.job, step=ctx.step, fio_runtime=int(params.get("fio_runtime", 30)),
                               fio_size=str(params.get("fio_size", "4G")))
    except ProbeSettingsError as exc:
        raise StepError(str(exc)) from None
    return {"problems": inventory.get("problems", []), "simulated": inventory.get("simulated", False)}


def run_deploy(ctx: StepContext) -> dict:
    previous = (ctx.step.result or {}).get("deployment")
    if previous and not previous.get("torn_down"):
        # A worker died in the middle of this deploy: stop what that attempt may have started.
        try:
            teardown_arm(ctx.job, ctx.step, ctx.node, previous)
        except (ssh.SSHError, DeployError) as exc:
            ctx.say(f"clearing the previous deploy attempt: {exc}")
    capacity_tokens = None
    if ctx.step.params.get("capped"):
        capacity_tokens, said = capped_tokens(ctx.job)
        ctx.say(f"{ctx.node.name}: {said}")
    cold = bool(ctx.step.params.get("cold_start"))
    extra = {}
    if "prefix_caching" in ctx.step.params:
        # G4's recompute as the customer would run vLLM without a KV tier: its prefix cache on (issue 44, item 3)
        wanted = bool(ctx.step.params["prefix_caching"])
        if "prefix_caching" in inspect.signature(deploy_arm).parameters:
            extra["prefix_caching"] = wanted
        elif wanted:
            ctx.say(f"{ctx.node.name}: NOTE this deploy cannot turn vLLM's prefix caching on for {ctx.step.arm} "
                    "(runners.deploy.deploy_arm takes no prefix_caching): it runs with --no-enable-prefix-caching")
    try:
        deployment = deploy_arm(ctx.job, ctx.step, ctx.node, ctx.step.arm, time_scale=_time_scale(ctx.job),
                                share_pool=bool(ctx.step.params.get("share_pool")), capacity_tokens=capacity_tokens,
                                cold_start=cold, **extra)
    except DeployError as exc:
        raise StepError(str(exc)) from None
    if cold:
        record_cold_start(ctx, deployment)
    return {"deployment": deployment.to_dict(), **({"cold_start": deployment.cold_start} if cold else {}),
            **({"prefix_caching": extra["prefix_caching"]} if "prefix_caching" in extra else {})}


def record_cold_start(ctx: StepContext, deployment: Deployment) -> None:
    """G1's measured cold start becomes the node's (Node.cold_start): later deploys' /health waits follow from it."""
    measured = {**deployment.cold_start, "job": str(ctx.job.code), "simulated": bool(deployment.simulated)}
    Node.objects.filter(pk=ctx.node.pk).update(cold_start=measured)
    ctx.node.cold_start = measured


def replay_sample(job: Job) -> dict:
    """What the run's replay step chose and its oracle (the `replay-sample` artifact, re-hashed on read)."""
    artifact = job.artifacts.filter(kind="replay-sample").order_by("pk").first()
    if artifact is None:
        raise StepError("the capacity check needs the replay's sample and oracle, and the run has none: the replay "
                        "step did not store its replay-sample")
    return json.loads(read_artifact(artifact))


def capped_tokens(job: Job) -> tuple[int, str]:
    """The tokens G4's capacity check caps the fx tier at (gates.traces.capacity, from the replay's oracle), and a
    line for the log. Traffic with little or unknown reuse still gets its capped replay (one block): the judge says
    the check does not apply to it, never that FX failed."""
    check = ((replay_sample(job).get("oracle") or {}).get("capacity_check")) or {}
    block = int(check.get("block_tokens") or 512)
    if not check.get("applicable"):
        return block, ("capacity check: the replayed traffic's reuse is "
                       + ("little" if check.get("reason") == "little-reuse" else "unknown")
                       + f"; the tier is capped at one block ({block} tokens) and the check will not apply")
    return int(check["capacity_tokens"]), (
        f"capacity check: the fx tier capped at {int(check['capacity_tokens'])} tokens, "
        f"{100 * float(check['fraction']):g} % of the {int(check['capacity_for_share_tokens'])} that capture "
        f"{100 * float(check['share']):g} % of the sample's reuse; the oracle predicts "
        f"{100 * float(check['predicted_hit_fraction']):.1f} % of the prompt tokens from the tier")


def run_collect(ctx: StepContext) -> dict:
    deployment = _deployment(ctx)
    try:
        artifacts = collect_deployment(ctx.job, ctx.step, ctx.node, deployment)
    except DeployError as exc:
        raise StepError(str(exc)) from None
    records = [a.name for a in artifacts if a.kind == "records"]
    if not records:
        raise StepError(f"no request records came back from {ctx.node.name} ({deployment.records_dir})")
    return {"artifacts": len(artifacts), "records": records}


def run_teardown(ctx: StepContext) -> dict:
    deploy = ctx.sibling(ctx.step.params["deploy"])
    data = (deploy.result or {}).get("deployment")
    if not data:
        return {"skipped": "the deploy left nothing to tear down"}
    deployment = Deployment.from_dict(data)
    try:
        teardown_arm(ctx.job, ctx.step, ctx.node, deployment)
    except DeployError as exc:
        raise StepError(str(exc)) from None
    retrieves = _retrieve_records(ctx, deployment)
    return {"torn_down": True, "retrieve_records": retrieves}


def retrieval_tier_of(job: Job, deployment: Deployment) -> str | None:
    """The tier that served the deployment's LMCache retrievals, from the configuration the deploy rendered for it
    (its lmcache.yaml artifact): only the configuration can say (runners.lmcache.retrieval_tier)."""
    config = Artifact.objects.filter(job=job, kind="config", name=f"{deployment.name_prefix}/lmcache.yaml").first()
    text = read_artifact(config).decode("utf-8", errors="replace") if config is not None else None
    return lmcache.retrieval_tier(deployment.arm, text)


def _retrieve_records(ctx: StepContext, deployment: Deployment) -> int:
    """LMCache "Retrieved …" lines of the server log → fxpilot.retrieve/1 records (the judge's read_bw)."""
    if deployment.arm == "recompute":
        return 0
    logs = Artifact.objects.filter(job=ctx.job, kind="server-log", name__startswith=deployment.name_prefix + "/")
    tier = retrieval_tier_of(ctx.job, deployment)
    records = []
    for artifact in logs.order_by("name"):
        records += lmcache_log.parse_log(read_artifact(artifact).decode("utf-8", errors="replace"),
                                         run_id=deployment.run_id, arm=deployment.arm, instance=deployment.instance,
                                         simulated=deployment.simulated, tier=tier)
    if records:
        store_bytes(ctx.job, f"{deployment.name_prefix}/retrieve.jsonl", lmcache_log.to_jsonl(records), kind="retrieve",
                    step=ctx.step, node=ctx.node, simulated=deployment.simulated)
    return len(records)


# ── workload phases, detached ──────────────────────────────────────────────────────────────────


def _workload_args(ctx: StepContext, deployment: Deployment, conn: ssh.NodeConnection, run_dir: str) -> list[str]:
    step, job = ctx.step, ctx.job
    params = step.params
    command = WORKLOAD_COMMANDS[step.name]
    loads = gateplans.workloads(job)
    # evict writes no records: its (empty) file stays out of the records the judge reads.
    out = f"{deployment.records_dir}/{step.seq:02d}-{step.name}.jsonl"
    if command == "evict":
        out = f"{run_dir}/none.jsonl"
    args = [command, "--url", deployment.url, "--arm", deployment.arm, "--out", out, "--run-id", run_id_of(job),
            "--instance", deployment.instance,
            # a node registered as real is asked, not told: the client labels the records simulated when the server
            # says it is the simulator (its /metrics), so a flag or the server can make them simulated, never real
            "--simulated", "yes" if deployment.simulated else "auto",
            *plan_args("cold-recovery" if command in ("populate", "evict", "measure") else command, loads)]
    versions = _versions(ctx, conn, deployment)
    if versions:
        args += ["--versions", json.dumps(versions, sort_keys=True)]
    if params.get("concurrency"):
        args += ["--concurrency", ",".join(str(c) for c in params["concurrency"])]
    if params.get("repetitions"):
        args += ["--repetitions", str(params["repetitions"])]
    if params.get("first_repetition"):
        args += ["--first-repetition", str(params["first_repetition"])]
    args += tier_args(step.name, deployment)
    if command == "replay":
        # the customer's trace in its own format, sampled by whole sessions with content-addressed blocks; the
        # capacity check replays the same sample (the same bytes: prepare is deterministic on the same inputs,
        # the tiers above FX as the first replay read them), once, strictly in the trace's order
        trace = f"{run_dir}/trace.csv"
        above = tiers_above_fx(ctx, conn, deployment)
        data, name = _trace(ctx)
        try:
            replay_bytes, chosen = prepare_replay(data, dict(loads.get("replay") or {}), above, name=name,
                                                  vllm_flags=list(settings_for(job, ctx.node).extra_vllm_flags))
        except ValueError as exc:
            raise StepError(f"the trace cannot be replayed: {exc}") from None
        conn.upload(replay_bytes, trace)
        args += ["--trace", trace, "--time-scale", str(_time_scale(job)), "--max-sessions", "0",
                 "--block-tokens", str(chosen["block_tokens"] or 512), "--ordered"]
        if step.name == "capacity":
            # one request in flight: the tier stores each answer before the next lookup, as the oracle's LRU counts
            # (with requests overlapping, lookups run ahead of the stores' evictions and the capped tier serves more
            # than the oracle predicts: +25 points measured on the simulator)
            args += ["--phase", "capacity", "--repetitions", "1", "--max-in-flight", "1"]
        else:
            ctx.say(f"{ctx.node.name}: {tracereplay.describe(chosen)}")
            # what was replayed (sampled share, replayed rate, prompts cut) and what sits above FX is evidence the
            # reports state
            chosen = {**chosen, "tiers_above_fx": above}
            store_bytes(job, f"{deployment.name_prefix}/replay-sample.json",
                        json.dumps(chosen, sort_keys=True).encode(), kind="replay-sample", step=ctx.step,
                        node=ctx.node, simulated=deployment.simulated)
            # an in-flight cap as large as the sessions replayed never holds a request back (a session has one in
            # flight at most); the records carry the most requests measured in flight as their concurrency, the
            # cap as concurrency_cap
            sessions = int(chosen.get("sampled_sessions") or params["max_sessions"] or 1)
            args += ["--max-in-flight", str(max(1, sessions))]
    elif command == "share":
        reader = _deployment(ctx, params["reader"])
        args += ["--url-b", reader.url, "--instance-b", reader.instance, "--sessions", str(params["sessions"])]
    elif command == "soak":
        args += ["--duration-s", f"{max(params['seconds'], 0.1):.3f}", "--windows", str(params["windows"])]
        if params.get("min_requests"):
            args += ["--min-requests", str(int(params["min_requests"]))]
        dram, _ = dram_tokens(ctx, deployment) if deployment.arm in ("dram", "local_nvme", "fx") else (None, "")
        if dram:
            # the session pool sized above HBM and LMCache's DRAM: the soak's returns come from the disk tier
            args += ["--dram-tokens", str(int(dram))]
        args += soak_rate_args(ctx, deployment)
    elif command == "fault":
        interface = _roce_interface(ctx)
        cut = max(float(params["cut_seconds"]), 0.05)
        # changing a link needs root: through password-less sudo (the preflight checks it), whose refusal is an exit
        # code the judge reads — a cut that did not happen never passes for a 60 s outage survived
        link = f"sudo -n ip link set dev {shlex.quote(interface)}"
        args += ["--fault-start", f"{cut:.3f}", "--fault-seconds", f"{cut:.3f}",
                 "--cut-cmd", f"{link} down", "--restore-cmd", f"{link} up"]
    return once(args)


def tier_args(step_name: str, deployment: Deployment) -> list[str]:
    """The client's tier flags for a step on this deployment: `--disk-device` (the disk tier's block device, its
    read counters sampled with every /metrics scrape) on every step of an arm with a disk tier, and `--lmcache-api`
    (every LMCache process's internal API server: its DRAM emptied at each eviction) on the cold-window steps
    (COLD_WINDOW_STEPS). A deployment record without these fields (an older deploy) gets neither."""
    out: list[str] = []
    device = getattr(deployment, "disk_device", None)
    if device:
        out += ["--disk-device", str(device)]
    if step_name in COLD_WINDOW_STEPS:
        for url in getattr(deployment, "lmcache_api_urls", None) or []:
            out += ["--lmcache-api", str(url)]
    return out


def soak_rate_args(ctx: StepContext, deployment: Deployment) -> list[str]:
    """`--rate` for the soak (open loop at the planned rate, gateplans.soak_rate_plan), the plan and its source kept as
    evidence (`<deployment>/soak-rate.json`, kind soak-rate) and said in the log; without a planned rate the soak
    runs its closed loop and the log says why."""
    params = ctx.step.params
    planned = dict(params.get("rate_plan") or {})
    rate = params.get("rate")
    if rate and deployment.simulated and (planned.get("source") or {}).get("kind") == "g3-throughput":
        # A simulated server's speed is this machine's CPU: G3's wall-clock throughput (one cell, the machine
        # otherwise quiet) does not carry over to a soak beside the other node's work, and an open loop on the wall
        # clock then measures the machine (the demo's soak filled its in-flight cap at half the calibrated capacity,
        # 2026-12-05). A simulated soak keeps its closed loop unless the run names a rate (soak_rate).
        planned["reason"] = ("simulated nodes: a schedule on the wall clock would measure this machine's CPU, not the "
                             "simulated server; the planned rate is kept as evidence, the soak runs its closed loop")
        planned["planned_rate_per_s"] = rate
        rate = None
    planned["open_loop"] = bool(rate)
    store_bytes(ctx.job, f"{deployment.name_prefix}/soak-rate.json", json.dumps(planned, sort_keys=True).encode(),
                kind="soak-rate", step=ctx.step, node=ctx.node, simulated=deployment.simulated)
    if not rate:
        ctx.say(f"{ctx.node.name}: soak: closed loop of {params['concurrency'][0]} clients — no rate could be planned "
                f"({planned.get('reason') or 'no rate_plan'})")
        return ["--closed-loop"]
    ctx.say(f"{ctx.node.name}: soak: open loop at {float(rate):.3g} requests/s ({gateplans.soak_rate_source(planned)}), "
            f"{params['windows']} windows over {float(params['seconds']):g} s")
    out = ["--rate", f"{float(rate):.6g}"]
    arrivals = str(planned.get("arrivals") or "poisson")
    if arrivals != "poisson":
        raise StepError(f"workloads.soak.arrivals is {arrivals!r}: the gate run's soak offers poisson arrivals only "
                        "(the customer trace's arrival shape is not wired to it)")
    out += ["--arrivals", arrivals]
    if planned.get("max_lateness_s") is not None:
        out += ["--max-lateness-s", f"{float(planned['max_lateness_s']):g}"]
    return out


def tiers_above_fx(ctx: StepContext, conn: ssh.NodeConnection, deployment: Deployment) -> dict:
    """What sits above FX on this deployment, in tokens, for the replay's sample (issue 44, item 1): vLLM's HBM prefix
    cache (`vllm:cache_config_info`: num_gpu_blocks × block_size, read from the server) and LMCache's DRAM
    (`sizes.max_local_cpu_size` GiB per rank × TP ÷ the KV bytes per token). Every replay of a run uses the figures
    its first replay read (kept in its replay-sample), so every arm and the capacity check replay the same sample."""
    earlier = _replay_sample_or_none(ctx.job)
    if earlier is not None and isinstance(earlier.get("tiers_above_fx"), dict):
        return earlier["tiers_above_fx"]
    found: dict = {"hbm_tokens": None, "dram_tokens": None}
    text, error = _metrics_text(conn, deployment)
    hbm = client.hbm_tokens(text) if text else None
    found["hbm_tokens"] = hbm
    found["hbm_source"] = (f"vllm:cache_config_info of {deployment.instance}" if hbm else
                           f"{deployment.instance} did not report vllm:cache_config_info" + (f" ({error})" if error else ""))
    found["dram_tokens"], found["dram_source"] = dram_tokens(ctx, deployment)
    return found


def dram_tokens(ctx: StepContext, deployment: Deployment) -> tuple[int | None, str]:
    """LMCache's DRAM in tokens on this deployment, and how it was found: `sizes.max_local_cpu_size` GiB per rank ×
    TP ÷ the KV bytes per token (each rank keeps its share of every token); None when the bytes are not known."""
    settings_ = settings_for(ctx.job, ctx.node)
    try:
        per_token = kv_bytes_per_token(settings_, deployment.simulated)
    except ValueError as exc:
        return None, str(exc)
    size = float(settings_.sizes.max_local_cpu_size)
    tp = int(settings_.tensor_parallel_size)
    return (int(size * GIB * tp // per_token) if size > 0 else 0,
            f"sizes.max_local_cpu_size {size:g} GiB per rank × TP {tp} ÷ {per_token} KV bytes per token")


def prepare_replay(data: bytes, replay: dict, above: dict, *, name: str, vllm_flags: list[str]) -> tuple[bytes, dict]:
    """runners.tracereplay.prepare with the trace's own name, the deployment's vLLM flags (its --max-model-len) and
    the tiers above FX (`hbm_tokens`, `dram_tokens`)."""
    return tracereplay.prepare(data, replay, vllm_flags=vllm_flags, name=name, hbm_tokens=above.get("hbm_tokens"),
                               dram_tokens=above.get("dram_tokens"))


def _replay_sample_or_none(job: Job) -> dict | None:
    artifact = job.artifacts.filter(kind="replay-sample").order_by("pk").first()
    return json.loads(read_artifact(artifact)) if artifact is not None else None


def _metrics_text(conn: ssh.NodeConnection, deployment: Deployment) -> tuple[str, str | None]:
    """The server's /metrics as read on the node (it listens there), or ("", why not)."""
    script = ("import sys, urllib.request\n"
              "with urllib.request.urlopen(sys.argv[1] + '/metrics', timeout=60) as answer:\n"
              "    sys.stdout.write(answer.read().decode('utf-8', 'replace'))\n")
    res = conn.run(f"python3 -c {shlex.quote(script)} {shlex.quote(deployment.url)}", echo=False, check=False,
                   timeout=120)
    if res.exit_code != 0:
        return "", f"reading its /metrics failed: {' | '.join(res.stderr.strip().splitlines()[-1:])}"
    return res.stdout, None


SWITCHES = ("--ordered", "--unordered", "--closed-loop", "--quiet", "--no-warm")
"""The client's flags that take no value."""
REPEATABLE = ("--lmcache-api",)
"""The client's flags given once per value."""


def once(args: list[str]) -> list[str]:
    """The workload's arguments with each flag once: the plan's defaults first, the run's own values replace them
    where they stand (the client would take the last anyway; the command logged is the command run). Switches
    (SWITCHES) take no value; a repeatable flag (REPEATABLE) keeps each of its values once, in order."""
    command, rest = args[0], list(args[1:])
    flags: dict[str, list[str | None]] = {}
    i = 0
    while i < len(rest):
        flag = rest[i]
        if not flag.startswith("--"):
            raise StepError(f"the workload arguments are not flag/value pairs: {rest!r}")
        if flag in SWITCHES:
            flags[flag] = [None]
            i += 1
            continue
        if i + 1 >= len(rest):
            raise StepError(f"the workload arguments are not flag/value pairs: {rest!r}")
        value = rest[i + 1]
        if flag in REPEATABLE:
            kept = flags.setdefault(flag, [])
            if value not in kept:
                kept.append(value)
        else:
            flags[flag] = [value]
        i += 2
    out = [command]
    for flag, values in flags.items():
        for value in values:
            out += [flag] if value is None else [flag, value]
    return out


def _versions(ctx: StepContext, conn: ssh.NodeConnection, deployment: Deployment) -> dict:
    """The versions the deploy's preflight found (manifest.json), for the phase summaries the judge checks, with
    what the deploy observed and the sizes the judge's tier attribution needs: every process's NONE_HASH
    (none_hash: the deployment record's, collected at /health), LMCache's fingerprint, the model, its KV dtype and
    KV bytes per token (the manifest's when it says, else from the settings the deploy rendered with)."""
    res = conn.run(f"cat {ssh.shell_path(deployment.arm_dir + '/manifest.json')}", echo=False, check=False, timeout=30)
    try:
        manifest = json.loads(res.stdout)
        found = manifest.get("versions") or {}
    except (ValueError, AttributeError):
        return {}
    lmcache = found.get("lmcache") or {}
    # the connector the server was started with: the judge checks a real cache arm ran LMCache's
    # and how a disk hit was kept from being a page-cache hit (O_DIRECT, a page-cache drop): checked too
    # and the chunk hash the server ran with: the instances of a sharing test must hash alike
    connector = {"kv_connector": manifest.get("kv_connector"), "page_cache": manifest.get("page_cache"),
                 "chunk_hash": manifest.get("chunk_hash")}
    if isinstance(lmcache, dict):
        out = {"vllm": found.get("vllm"), "lmcache": lmcache.get("version"), "lmcache_commit": lmcache.get("commit"),
               "lmcache_hip": lmcache.get("hip"), "rocm": found.get("rocm"), **connector}
    else:
        out = {"vllm": found.get("vllm"), "lmcache": lmcache, "rocm": found.get("rocm"), **connector}
    none_hash = getattr(deployment, "none_hash", None) or found.get("none_hash")
    if none_hash:
        out["none_hash"] = none_hash
    fingerprint = getattr(deployment, "lmcache_fingerprint", None) or found.get("lmcache_fingerprint")
    if fingerprint:
        out["lmcache_fingerprint"] = fingerprint
    out.update(_kv_sizes(ctx, manifest, found, deployment))
    return out


def _kv_sizes(ctx: StepContext, manifest: dict, found: dict, deployment: Deployment) -> dict:
    """model, kv_cache_dtype and kv_bytes_per_token for the summaries' versions (gates.judge.tiers reads them)."""
    out = {"model": manifest.get("model")} if manifest.get("model") else {}
    stated = found.get("kv_bytes_per_token") or manifest.get("kv_bytes_per_token")
    try:
        settings_ = settings_for(ctx.job, ctx.node)
        out["kv_cache_dtype"] = found.get("kv_cache_dtype") or lmcache.kv_dtype_of(settings_, deployment.simulated)
        out["kv_bytes_per_token"] = int(stated) if stated else kv_bytes_per_token(settings_, deployment.simulated)
    except (ValueError, TypeError):
        if stated:
            out["kv_bytes_per_token"] = stated
    return out


def _roce_interface(ctx: StepContext) -> str:
    interface = settings_for(ctx.job, ctx.node).roce_interface
    if not interface:
        raise StepError("deployment.roce_interface is not set: the fault window needs the RoCE interface to cut")
    return interface


def _trace(ctx: StepContext) -> tuple[bytes, str]:
    """The run's trace and its own file name (the uploaded file's, kept as the run's `trace_file`; else the
    artifact's)."""
    artifact = ctx.job.artifacts.filter(name__in=[TRACE_NAME, SAMPLE_TRACE_NAME]).order_by("name").first()
    if artifact is None:
        raise StepError("the run has no trace to replay")
    name = ctx.job.params.get("trace_file") if artifact.name == TRACE_NAME else None
    return read_artifact(artifact), str(name or artifact.name)


def start_workload(ctx: StepContext) -> dict:
    deployment = _deployment(ctx)
    run_dir = f"{deployment.arm_dir}/steps/{ctx.step.seq:02d}-{ctx.step.name}"
    with ssh.connect(ctx.node) as conn:
        adopted = _adopt(conn, run_dir) if ctx.step.remote.get("dir") == run_dir else None
        if adopted:
            ctx.say(f"{ctx.node.name}: the process of an earlier attempt is running in {run_dir}; following it")
            return adopted
        ctx.save_remote({"dir": run_dir})
        conn.mkdirs(run_dir)
        args = _workload_args(ctx, deployment, conn, run_dir)
        command = f"exec python3 {ssh.shell_path(deployment.workload)} " + " ".join(shlex.quote(a) for a in args)
        proc = detached.start(conn, run_dir, command, job=ctx.job, step=ctx.step)
    return proc.to_dict()


def _adopt(conn: ssh.NodeConnection, run_dir: str) -> dict | None:
    res = conn.run(f"cd {ssh.shell_path(run_dir)} 2>/dev/null && cat pid pgid 2>/dev/null", echo=False, check=False,
                   timeout=30)
    numbers = res.stdout.split()
    if len(numbers) == 2 and all(n.isdigit() for n in numbers):
        return detached.RemoteProcess(dir=run_dir, pid=int(numbers[0]), pgid=int(numbers[1])).to_dict()
    return None


def _progress(text: str) -> tuple[int | None, int | None, int | None]:
    """The last `PROGRESS done/total [ok=N]` line's figures: requests ended, planned, and ended error-free (None
    from a client that does not say)."""
    done = total = ok = None
    for line in text.splitlines():
        if line.startswith("PROGRESS "):
            fields = line.split()
            figures = fields[1].split("/")
            if len(figures) == 2 and all(f.isdigit() for f in figures):
                done, total = int(figures[0]), int(figures[1])
                ok = next((int(f[3:]) for f in fields[2:] if f.startswith("ok=") and f[3:].isdigit()), None)
    return done, total, ok


def poll_workload(ctx: StepContext) -> Poll:
    deployment = _deployment(ctx)
    with ssh.connect(ctx.node) as conn:
        found = detached.poll(conn, ctx.step.remote)
        done, total, ok = _progress(found.stdout)
        # with the process, the error-free requests so far: what a soak's floor counts (runners.progress)
        ctx.save_remote({**ctx.step.remote, **found.proc.to_dict(), **({"requests_ok": ok} if ok is not None else {})})
        server = detached.poll(conn, deployment.server, max_bytes=0) if deployment.server else None
        trouble = _lmcache_trouble(ctx, conn, deployment)
    if trouble:
        if found.running:
            with ssh.connect(ctx.node) as conn:
                detached.cancel(conn, ctx.step.remote, grace_seconds=3)
        raise StepError(lmcache_trouble_message(ctx.node, deployment, trouble))
    if server is not None and not server.running:
        if found.running:
            with ssh.connect(ctx.node) as conn:
                detached.cancel(conn, ctx.step.remote)
        raise StepError(f"the {deployment.arm} server on {ctx.node.name} {server.state} during {ctx.step.name} "
                        f"(exit code {server.exit_code}); its log is kept with the run")
    if found.state in ("vanished", "canceled"):
        raise StepError(f"the workload process on {ctx.node.name} {found.state} without an exit code")
    # an ended client whose log is not yet all read is looked at again: its last lines (the final progress) count
    return Poll(running=not found.finished, exit_code=found.exit_code, requests_done=done, requests_total=total,
                output=found.stdout, stderr=found.stderr)


def _lmcache_trouble(ctx: StepContext, conn: ssh.NodeConnection, deployment: Deployment) -> str | None:
    """The server log's new lines, looked at for LMCache failing, running degraded or losing a connection (the
    deploy checked its start; this is the rest of the run). A fault step cuts the path on purpose: what LMCache
    logs during it is passed over, not held against the run."""
    if not deployment.config_path:
        return None
    line = lmcache_trouble(conn, deployment)
    save_log_checked(ctx.sibling(ctx.step.params["deploy"]), deployment)
    return None if ctx.step.name == "fault" else line


def finish_workload(ctx: StepContext, found: Poll) -> dict:
    if found.exit_code != 0:
        reasons = {2: "bad arguments or trace", 3: "the server or the eviction could not be used"}
        reason = reasons.get(found.exit_code, "")
        tail = " | ".join(found.stderr.strip().splitlines()[-3:]) if found.stderr else ""
        raise StepError(f"the workload client exited with code {found.exit_code}"
                        + (f" ({reason})" if reason else "") + (f": {tail}" if tail else ""))
    return {"exit_code": 0, "requests": found.requests_done}


def workload_max_seconds(step) -> float:
    """How long a workload step's remote work may last: a soak its own length on top of the usual deadline
    (FXPILOT_STEP_DEADLINE_SECONDS); while it may still run, an unreachable node is looked for again."""
    seconds = float(step.params.get("seconds") or 0)
    if step.params.get("min_requests"):
        seconds *= 2  # a soak short of its failure-rate bar's requests sends on for at most its length again
    return seconds + float(settings.FXPILOT_STEP_DEADLINE_SECONDS)


def cancel_workload(ctx: StepContext) -> None:
    if not ctx.step.remote.get("pid"):
        return
    with ssh.connect(ctx.node) as conn:
        detached.cancel(conn, ctx.step.remote, grace_seconds=3)


# ── evaluate ───────────────────────────────────────────────────────────────────────────────────


def run_evaluate(ctx: StepContext) -> dict:
    """Judge the run (once), then carry out what gates.consequences decides the verdict does."""
    job = ctx.job
    since = int(ctx.step.params.get("after_evaluation", 0))
    evaluation = Evaluation.objects.filter(job=job, pk__gt=since).order_by("-pk").first()
    if evaluation is None:
        try:
            evaluation = evaluate_job(job)
        except PlanTamperedError as exc:  # not a verdict: the signed plan must be restored or amended
            raise StepError(f"refused to judge: {exc}") from None
        except (judge.RecordError, ArtifactMismatch, ValueError) as exc:
            raise StepError(f"the judge could not use the collected data: {exc}") from None
    result = {"evaluation": evaluation.pk, "verdict": evaluation.verdict}
    ctx.say(f"verdict {evaluation.verdict} (evaluation {evaluation.pk})")
    gate = Gate.objects.select_related("pilot").get(pk=job.gate_id)
    done = _repetitions_done(job)
    decided = consequences.consequence(gate, evaluation, consequences.Ran(
        repetitions=done, may_extend=job.params.get("extend_marginal", True)))
    if decided.action == consequences.EXTEND:
        if any(s.params.get("after_evaluation") == evaluation.pk for s in job.steps.filter(name="evaluate")):
            return {**result, "extended": True}  # an earlier attempt of this step already extended the run
        added = extend_run(job, ctx.step, evaluation, first_repetition=done + 1, extra=decided.repetitions)
        ctx.say(f"marginal: {added} more steps measure repetition {done + 1} of every cell; judged again after")
        return {**result, "extended": True, "repetitions_done": done + decided.repetitions}
    try:
        lifecycle.record_verdict(gate, evaluation, who="orchestrator")
    except lifecycle.TransitionRefused as exc:
        raise StepError(f"the verdict could not be recorded: {exc}") from None
    if decided.action == consequences.HALT:
        raise StepFailed(decided.reason)
    if decided.action == consequences.INVALID:
        raise StepError(decided.reason)
    return result


def _repetitions_done(job: Job) -> int:
    measured = [s.params.get("first_repetition", 1) + s.params.get("repetitions", 1) - 1
                for s in job.steps.filter(name="measure", status="successful")]
    return max(measured, default=0)


def run_note(ctx: StepContext) -> dict:
    ctx.say(ctx.step.params.get("text", ""))
    return {}


GATE_RUN_KINDS = [
    StepKind("probe", run=run_probe, soft_time_limit=1800),
    StepKind("deploy", run=run_deploy, soft_time_limit=DEPLOY_TIME_LIMIT_S),
    StepKind("collect", run=run_collect, soft_time_limit=1800),
    StepKind("teardown", run=run_teardown, soft_time_limit=900),
    StepKind("evaluate", run=run_evaluate, soft_time_limit=900),
    StepKind("note", run=run_note, soft_time_limit=60),
    *(StepKind(name, start=start_workload, poll=poll_workload, finish=finish_workload, cancel=cancel_workload,
               soft_time_limit=300, max_seconds=workload_max_seconds) for name in WORKLOAD_COMMANDS),
]
"""The kinds of step a gate run is made of; RunnersConfig.ready() registers them."""
