"""Deploy vLLM (+ LMCache, + the FX array) for one arm on a node and wait until it answers.

The node-side work is plain bash in runners/remote/ (deploy.sh, attach_fx.sh); this module validates the
pilot's deployment settings, renders the per-arm files, ships them by SFTP, starts the server detached and
waits for /health from the node itself (the server listens on the node's loopback), keeping the rendered
config as an artifact. Its neighbours: runners.deployment (the record and shared helpers), runners.lmcache,
runners.collect, runners.teardown (which a failed deploy calls).
"""
from __future__ import annotations

import json
import re
import secrets
import shlex
import time
from pathlib import Path
from typing import Any

from runners import detached, ssh
from runners.artifacts import store_bytes
from runners.config import (
    ARMS,
    DISK_ARMS,
    LMCACHE_ARMS,
    DeploymentSettings,
    HealthTimeout,
    health_timeout,
    shell_env_file,
)
from runners.deployment import (
    DeployError,
    Deployment,
    error_lines_of,
    run_id_of,
    run_script,
    save_deployment,
    say,
    server_log_tail,
    settings_for,
)
from runners.lmcache import (
    CHUNK_HASH_ALGORITHM,
    LMCACHE_TROUBLE,
    MODEL_CONFIGS,
    PYTHONHASHSEED,
    api_urls,
    cache_dirs,
    disk_size_for,
    expected_none_hash,
    render_lmcache_config,
    sizing,
)
from runners.models import Job, Node, Step
from runners.teardown import teardown_arm

REMOTE_DIR = Path(__file__).resolve().parent / "remote"
SCRIPTS = ("deploy.sh", "lmcache_inspect.py", "attach_fx.sh", "workload.py")  # deploy.sh reads lmcache_inspect.py
HEALTH_POLL_S = 5           # one SSH command waits at most this long; between looks: cancel, the log, progress
HEALTH_PROGRESS_S = 30      # how often the wait says how long it has waited


PILOT_CONNECTOR = "LMCacheConnectorV1"


def refuse_test_connector(job: Job, node: Node, settings: DeploymentSettings) -> None:
    """vLLM's ExampleConnector (whole prompts' KV as files, no LMCache) is for checking the pipeline: on simulated
    nodes, or in the real-engine test tier that says so (`engine_test_tier: true`); never a pilot's real cache arm."""
    if settings.kv_connector == PILOT_CONNECTOR or settings.engine_test_tier:
        return
    real = set(Node.objects.filter(site__pilot_id=job.pilot_id, simulated=False).values_list("name", flat=True))
    if not node.simulated:
        real.add(node.name)
    if real:
        raise DeployError(f"node {node.name}: deployment.kv_connector is {settings.kv_connector}, vLLM's reference "
                          f"connector, not LMCache: a pilot with real nodes ({', '.join(sorted(real))}) deploys "
                          f"{PILOT_CONNECTOR} (only the real-engine test tier sets engine_test_tier: true)")


def _fx_params(settings: DeploymentSettings, run_dir: str) -> dict[str, Any]:
    target = settings.fx_target
    return {"FX_ADDRESS": target.address, "FX_SERVICE_ID": target.service_id, "FX_NQN": target.nqn,
            "FX_HOST_NQN": target.host_nqn, "FX_FSTYPE": target.fstype, "FX_MOUNT": settings.paths.fx_mount,
            "MKFS_IF_EMPTY": settings.mkfs_if_empty, "RUN_DIR": run_dir}


def deploy_arm(job: Job, step: Step | None, node: Node, arm: str, *, time_scale: float | None = None,
               share_pool: bool = False, capacity_tokens: int | None = None, cold_start: bool = False,
               prefix_caching: bool = False) -> Deployment:
    """Ship, attach FX when the arm needs it, start the server detached and wait for /health; tear down on failure.

    `cold_start` (G1): the server starts with empty compile caches and deploy.sh measures the seconds from launch to
    /health on the node (`Deployment.cold_start`, the manifest's `cold_start`); the wait is the fixed
    `health_timeout_s`. Any other deploy waits as long as `runners.config.health_timeout` says for the node's
    measured cold start (`Node.cold_start`). `capacity_tokens` (G4's capacity check): the fx arm's disk tier capped
    at that many tokens, without the shared pool. `prefix_caching` (recompute only; G4's replay): vLLM's own prefix
    cache stays on, as a customer runs vLLM without a KV tier; the recompute arm of G1–G3 runs without it."""
    if arm not in ARMS:
        raise DeployError(f"node {node.name}: unknown arm {arm!r}; arms are {', '.join(ARMS)}")
    settings = settings_for(job, node)
    refuse_test_connector(job, node, settings)
    run_id = run_id_of(job)
    with ssh.connect(node) as conn:
        home = conn.run('printf %s "$HOME"', echo=False, timeout=30).stdout.strip()
        settings = settings.with_home(home)
        run_dir = f"{settings.paths.run_root}/{run_id}"
        deployment = Deployment(run_id=run_id, arm=arm, node=node.name, deploy_id=secrets.token_hex(3), run_dir=run_dir,
                                arm_dir="", share_pool=share_pool and arm == "fx" and capacity_tokens is None,
                                capacity_tokens=capacity_tokens if arm == "fx" else None, simulated=node.simulated,
                                host=settings.bind_address(node.name), cold_start_measured=cold_start,
                                prefix_caching=bool(prefix_caching) and arm == "recompute")
        deployment.arm_dir = f"{run_dir}/{arm}-{deployment.deploy_id}"
        try:
            _deploy(job, step, node, conn, settings, deployment, time_scale)
        except Exception as exc:
            # Whatever stopped the deploy (a time limit included), what it started is stopped too.
            say(job, step, node, f"deploy of {arm} failed; tearing down")
            try:
                teardown_arm(job, step, node, deployment)
            except (ssh.SSHError, DeployError) as teardown_exc:
                say(job, step, node, f"teardown after the failed deploy also failed: {teardown_exc}")
            if isinstance(exc, DeployError):
                exc.deployment = deployment
                raise
            if isinstance(exc, ssh.SSHError):
                raise DeployError(str(exc), deployment=deployment) from exc
            raise
    return deployment


def plan_document(job: Job) -> dict | None:
    """The plan the run follows (the pilot's signed plan, else its latest draft), for the sizing preflight."""
    pilot = job.pilot
    plan = pilot.signed_plan or pilot.latest_plan
    document = getattr(plan, "document", None)
    return document if isinstance(document, dict) else None


def _model_config_json(conn: ssh.NodeConnection, settings: DeploymentSettings) -> dict | None:
    """The model's config.json read on the node: the model's path, or its snapshot in the node's Hugging Face cache
    (gates.sizing's table knows the usual ids; this is for the others)."""
    if settings.model.startswith("/"):
        command = f"cat -- {ssh.shell_path(settings.model + '/config.json')}"
    else:
        folder = "models--" + settings.model.replace("/", "--")
        hub = '"${HF_HUB_CACHE:-${HUGGINGFACE_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}}"'
        command = f"for f in {hub}/{shlex.quote(folder)}/snapshots/*/config.json; do cat -- \"$f\"; break; done"
    result = conn.run(command, echo=False, check=False, timeout=60)
    try:
        found = json.loads(result.stdout) if result.exit_code == 0 and result.stdout.strip() else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def check_sizing(job: Job, node: Node, conn: ssh.NodeConnection, settings: DeploymentSettings,
                 deployment: Deployment) -> dict:
    """The sizing preflight (runners.lmcache.sizing): a DRAM pool below the largest planned retrieval per rank (plus
    the margin) is refused before anything is started, naming both sizes."""
    if deployment.arm not in LMCACHE_ARMS or settings.kv_connector != PILOT_CONNECTOR:
        return {}
    try:
        found = sizing(settings, deployment.arm, simulated=node.simulated, plan_document=plan_document(job),
                       model_config_json=None if settings.model in MODEL_CONFIGS else _model_config_json(conn, settings))
    except ValueError as exc:
        raise DeployError(f"node {node.name}: {deployment.arm}: the sizing preflight cannot size LMCache's DRAM: {exc}",
                          deployment=deployment) from None
    deployment.sizing = found
    if not found.get("ok", True):
        raise DeployError(f"node {node.name}: {deployment.arm}: refused at preflight: {found['message']}",
                          deployment=deployment)
    return found


def _free_port_run(conn: ssh.NodeConnection, host: str, count: int) -> int:
    """The first of `count` consecutive ports free on the node (ports.base 0: simulated nodes share a loopback)."""
    script = ("import socket, sys\n"
              "host, count = sys.argv[1], int(sys.argv[2])\n"
              "low, high = 10000, 32000\n"
              "try:\n"
              "    first, last = map(int, open('/proc/sys/net/ipv4/ip_local_port_range').read().split())\n"
              "    high = min(high, first - count) if first > low + 1000 else high\n"
              "except (OSError, ValueError):\n"
              "    pass\n"
              "for start in list(range(OFFSET, high, count + 7)) + list(range(low, OFFSET, count + 7)):\n"
              "    held = []\n"
              "    try:\n"
              "        for port in range(start, start + count):\n"
              "            s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)\n"
              "            held.append(s)\n"
              "            s.bind((host, port))\n"
              "    except OSError:\n"
              "        continue\n"
              "    finally:\n"
              "        [s.close() for s in held]\n"
              "    print(start)\n"
              "    break\n")
    import random

    # below the kernel's ephemeral ports (32768–60999 by default: a client's connection may take one of those at any
    # moment, between this look and the server's bind), and from a random place so that two deploys at once rarely
    # pick the same run
    script = script.replace("OFFSET", str(10000 + random.randrange(0, 20000)))
    result = conn.run(f"python3 -c {shlex.quote(script)} {shlex.quote(host)} {int(count)}", echo=False, timeout=60)
    try:
        return int(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DeployError(f"no run of {count} free ports for LMCache's internal API server: {result.stdout[-200:]!r}") \
            from None


def _deploy(job: Job, step: Step | None, node: Node, conn: ssh.NodeConnection, settings: DeploymentSettings,
            deployment: Deployment, time_scale: float | None) -> None:
    arm = deployment.arm
    lmcache_arm = arm in LMCACHE_ARMS and settings.kv_connector == PILOT_CONNECTOR
    check_sizing(job, node, conn, settings, deployment)
    conn.mkdirs(deployment.bin_dir, deployment.arm_dir, deployment.records_dir, deployment.metrics_dir)
    save_deployment(step, deployment)
    for script in SCRIPTS:
        conn.upload((REMOTE_DIR / script).read_bytes(), f"{deployment.bin_dir}/{script}", mode=0o755)
    conn.upload(shell_env_file(_fx_params(settings, deployment.run_dir)).encode(), f"{deployment.run_dir}/fx.env")

    api_start = None
    if lmcache_arm:
        api_start = settings.ports.lmcache_api_start(arm, settings.tensor_parallel_size) or \
            _free_port_run(conn, "127.0.0.1", settings.tensor_parallel_size + 1)
        deployment.lmcache_api_urls = api_urls(api_start, settings.tensor_parallel_size)
        deployment.none_hash = {"expected": expected_none_hash(CHUNK_HASH_ALGORITHM, PYTHONHASHSEED), "observed": []}
    try:
        config = render_lmcache_config(settings, arm, run_id=deployment.run_id, share_pool=deployment.share_pool,
                                       simulated=node.simulated, capacity_tokens=deployment.capacity_tokens,
                                       api_port_start=api_start)
    except ValueError as exc:
        raise DeployError(f"node {node.name}: {exc}") from None
    store_bytes(job, f"{deployment.name_prefix}/lmcache.yaml", config.encode(), kind="config", step=step, node=node,
                simulated=node.simulated)
    if arm != "recompute" and settings.kv_connector == "LMCacheConnectorV1":
        deployment.config_path = f"{deployment.arm_dir}/lmcache.yaml"
        conn.upload(config.encode(), deployment.config_path)

    capped = deployment.capacity_tokens is not None
    disk_dir, pool_dir = cache_dirs(settings, arm, deployment.run_id, capped=capped)
    # the capped server of G4's capacity check: vLLM's own prefix cache off, so every hit is the capped tier's
    extra_flags = [*settings.extra_vllm_flags, *(["--no-enable-prefix-caching"] if capped else [])]
    params = {
        "RUN_ID": deployment.run_id, "ARM": arm, "NODE": node.name, "SIMULATED": node.simulated,
        "MODEL": settings.model, "TP": settings.tensor_parallel_size, "PORT": settings.ports.for_arm(arm),
        "BIND_HOST": deployment.host,
        "CACHE_DIR": disk_dir, "SHARED_DIR": pool_dir if deployment.share_pool else None,
        "KV_CONFIG_PATH": deployment.config_path, "USE_ODIRECT": settings.use_odirect,
        "DROP_PAGE_CACHE": settings.drop_page_cache, "PAGE_CACHE_METHOD": settings.page_cache_method,
        "MAX_LOCAL_DISK_SIZE": (disk_size_for(deployment.capacity_tokens, settings, node.simulated) if capped
                                else settings.sizes.max_local_disk_size), "EXTRA_VLLM_FLAGS": extra_flags,
        "SIM_TIME_SCALE": time_scale if (node.simulated and time_scale) else None,
        "KV_CONNECTOR": settings.kv_connector if arm != "recompute" else "",
        "CHUNK_HASH": CHUNK_HASH_ALGORITHM if deployment.config_path else "", "HASH_SEED": PYTHONHASHSEED,
        "LMCACHE_FAILED": LMCACHE_TROUBLE, "COLD_START": deployment.cold_start_measured,
        "PREFIX_CACHING": deployment.prefix_caching,
        "DRAM_GIB": settings.sizes.max_local_cpu_size if deployment.config_path else "",
        "LMCACHE_API_START": api_start if deployment.config_path else "",
        "DISK_IO_THREADS": settings.lmcache.disk_io_threads or "",
        "EXPECTED_NONE_HASH": (deployment.none_hash or {}).get("expected") or "",
        # the KV bytes per token of the deployed model and KV dtype (the sizing preflight's): the judge's tier-bytes
        # check compares device bytes with external hits × this (versions.kv_bytes_per_token in the manifest)
        "KV_BYTES_PER_TOKEN": deployment.sizing.get("kv_bytes_per_token") or "",
        "KV_CACHE_DTYPE": deployment.sizing.get("kv_dtype") or "",
        **settings.launcher.params(),
    }
    conn.upload(shell_env_file(params).encode(), f"{deployment.arm_dir}/params.env")

    if arm == "fx":
        deployment.fx_user = f"{arm}-{deployment.deploy_id}"
        save_deployment(step, deployment)
        run_script(conn, job, step, node, deployment, "attach_fx.sh", "attach", f"{deployment.run_dir}/fx.env",
                deployment.fx_user, what="attaching the FX array")

    out = run_script(conn, job, step, node, deployment, "deploy.sh", "preflight", deployment.arm_dir, what="preflight")
    match = re.search(r"^FXPILOT_PORT=(\d+)$", out, re.MULTILINE)
    if not match:
        raise DeployError(f"node {node.name}: preflight printed no port", deployment=deployment)
    deployment.port = int(match.group(1))
    _read_manifest(node, conn, settings, deployment)
    save_deployment(step, deployment)

    command = f"exec bash {ssh.shell_path(deployment.bin_dir + '/deploy.sh')} serve {ssh.shell_path(deployment.arm_dir)}"
    deployment.server = detached.start(conn, f"{deployment.arm_dir}/server", command, job=job, step=step).to_dict()
    save_deployment(step, deployment)
    say(job, step, node, f"{arm}: server starting on port {deployment.port} (pid {deployment.server.get('pid')})"
                         + (" with empty compile caches (cold start)" if deployment.cold_start_measured else ""))
    timeout = wait_for_health(node, settings, time_scale, measuring=deployment.cold_start_measured)
    deployment.health_timeout_s = timeout.seconds
    save_deployment(step, deployment)
    say(job, step, node, f"{arm}: waiting for /health up to {timeout.sentence}")
    measured, health_out = _wait_healthy(job, step, node, conn, timeout, deployment)
    deployment.healthy = True
    _observed_at_health(node, deployment, health_out)
    if deployment.cold_start_measured:
        if not measured:
            raise DeployError(f"node {node.name}: {arm}: the server is healthy but deploy.sh reported no cold start",
                              deployment=deployment)
        deployment.cold_start = measured
        store_bytes(job, f"{deployment.name_prefix}/cold-start.json", json.dumps(measured, indent=1, sort_keys=True)
                    .encode(), kind="cold-start", step=step, node=node, simulated=node.simulated)
    save_deployment(step, deployment)
    say(job, step, node, f"{arm}: healthy at {deployment.url}"
                         + (f"; cold start {measured['seconds']:.1f} s from launch to /health" if measured else ""))


def wait_for_health(node: Node, settings: DeploymentSettings, time_scale: float | None, *,
                    measuring: bool = False) -> HealthTimeout:
    """How long a deploy on this node waits for /health: from the cold start G1 measured there (read fresh: another
    run may have measured it since this node was loaded), else the fixed setting."""
    measured = Node.objects.filter(pk=node.pk).values_list("cold_start", flat=True).first() if node.pk else None
    return health_timeout(settings, measured, time_scale=time_scale if node.simulated else None, measuring=measuring)


def _wait_healthy(job: Job, step: Step | None, node: Node, conn: ssh.NodeConnection, timeout: HealthTimeout,
                  deployment: Deployment) -> tuple[dict | None, str]:
    """Wait for /health from the node, a few seconds per look. Between looks: a cancel of the run stops the
    wait (the caller tears the server down), the server log's new lines go to the run's live log, and every
    HEALTH_PROGRESS_S the wait says how long it has waited. deploy.sh exits 5 when the server answers but its
    log shows LMCache failing to initialise or running degraded: the deploy fails with that line.
    Returns the cold start deploy.sh measured (its FXPILOT_COLD_START line), if it measured one, and what the
    healthy look printed."""
    started = time.monotonic()
    timeout_s = timeout.seconds
    deadline = started + timeout_s
    said = started
    health = f"bash {ssh.shell_path(deployment.bin_dir + '/deploy.sh')} health {ssh.shell_path(deployment.arm_dir)}"
    where = f"node {node.name}: {deployment.arm}"
    while True:
        wait = max(1, min(HEALTH_POLL_S, int(deadline - time.monotonic())))
        # The detached runner writes exit_code when the server ends: the node stops waiting at once.
        ended = ssh.shell_path(deployment.server["dir"] + "/exit_code")
        result = conn.run(f"{health} {wait} {ended}", job=job, step=step, timeout=wait + 60, check=False, echo=False)
        status = detached.poll(conn, deployment.server, job=job, step=step)
        deployment.server = {**deployment.server, **status.proc.to_dict()}
        save_deployment(step, deployment)
        if result.exit_code == 0:
            return _cold_start_of(result.stdout), result.stdout
        if result.exit_code == 5:
            reason = error_lines_of(result.stderr_tail) or "LMCache did not initialise"
            raise DeployError(f"{where}: the server answers /health but {reason}", deployment=deployment,
                              log_tail=server_log_tail(conn, deployment))
        if not status.running:
            raise DeployError(f"{where}: the server {status.state} before it was healthy "
                              f"(exit code {status.exit_code})", deployment=deployment, log_tail=server_log_tail(conn, deployment))
        if _cancel_requested(job):
            raise DeployError(f"{where}: canceled while waiting for /health ({time.monotonic() - started:.0f} s)",
                              deployment=deployment)
        now = time.monotonic()
        if now >= deadline:
            raise DeployError(f"{where}: /health on port {deployment.port} did not answer within "
                              f"{timeout.sentence}", deployment=deployment,
                              log_tail=server_log_tail(conn, deployment))
        if now - said >= HEALTH_PROGRESS_S:
            said = now
            say(job, step, node, f"{deployment.arm}: waiting for /health on port {deployment.port}: "
                                  f"{now - started:.0f} s of {timeout_s} s")


def _read_manifest(node: Node, conn: ssh.NodeConnection, settings: DeploymentSettings, deployment: Deployment) -> None:
    """What the deploy's preflight found and the deployment record keeps: the disk tier's block device (its
    /proc/diskstats name) and LMCache's fingerprint; a fingerprint other than the plan's expected one
    (deployment.lmcache.fingerprint) stops the deploy with both values (infrastructure: `error`, never a `fail`)."""
    result = conn.run(f"cat -- {ssh.shell_path(deployment.arm_dir + '/manifest.json')}", echo=False, check=False,
                      timeout=60)
    try:
        manifest = json.loads(result.stdout)
    except ValueError:
        raise DeployError(f"node {node.name}: {deployment.arm}: the preflight left no readable manifest.json",
                          deployment=deployment) from None
    deployment.disk_device = (manifest.get("disk_device") or None) if deployment.arm in DISK_ARMS else None
    if not deployment.config_path:
        return
    versions = manifest.get("versions") or {}
    fingerprint = versions.get("lmcache_fingerprint") if isinstance(versions.get("lmcache_fingerprint"), dict) else None
    deployment.lmcache_fingerprint = fingerprint
    expected = settings.lmcache.fingerprint
    if expected:
        found = (fingerprint or {}).get("sha256")
        if found != expected:
            raise DeployError(
                f"node {node.name}: {deployment.arm}: LMCache's fingerprint is {found or 'unknown (no LMCache found)'} "
                f"(version {(fingerprint or {}).get('version')}, commit {(fingerprint or {}).get('commit')}), not the "
                f"plan's expected {expected} (deployment.lmcache.fingerprint): this node runs another LMCache build",
                deployment=deployment)


def _observed_at_health(node: Node, deployment: Deployment, stdout: str) -> None:
    """deploy.sh's FXPILOT_LMCACHE_OBSERVED line at /health: every LMCache process's NONE_HASH and O_DIRECT lines.
    A NONE_HASH other than the expected one stops the deploy with both values."""
    match = re.search(r"^FXPILOT_LMCACHE_OBSERVED=(\{.*\})$", stdout or "", re.MULTILINE)
    if not match or not deployment.none_hash:
        return
    try:
        found = json.loads(match.group(1))
    except ValueError:
        return
    observed = [item for item in (found.get("none_hash") or {}).get("observed") or []
                if isinstance(item, dict) and isinstance(item.get("value"), str)]
    deployment.none_hash = {**deployment.none_hash, "observed": observed}
    deployment.odirect_observed = [item for item in found.get("odirect") or [] if isinstance(item, dict)]
    expected = deployment.none_hash.get("expected")
    wrong = sorted({item["value"] for item in observed} - {expected})
    if wrong:
        raise DeployError(f"node {node.name}: {deployment.arm}: LMCache's first block hash is {', '.join(wrong)} in "
                          f"{', '.join(i['process'] for i in observed if i['value'] != expected)}, not the expected "
                          f"{expected} ({CHUNK_HASH_ALGORITHM}, PYTHONHASHSEED={PYTHONHASHSEED}): the processes would "
                          "not share chunks", deployment=deployment)


def _cold_start_of(stdout: str) -> dict | None:
    """deploy.sh's FXPILOT_COLD_START line, its figures checked for their types (the node keeps it, its page shows
    it and later deploys' waits follow from it): None when there is none or it does not hold up."""
    match = re.search(r"^FXPILOT_COLD_START=(\{.*\})$", stdout, re.MULTILINE)
    if not match:
        return None
    try:
        found = json.loads(match.group(1))
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value

    if not number(found.get("seconds")) or found["seconds"] < 0:
        return None
    scale = found.get("time_scale")
    if scale is not None and (not number(scale) or scale <= 0):
        return None
    if not isinstance(found.get("model"), str) or not number(found.get("tensor_parallel_size")):
        return None
    return found


def _cancel_requested(job: Job) -> bool:
    return Job.objects.filter(pk=job.pk, cancel_requested=True).exists()
