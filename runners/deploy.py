"""Deploy vLLM (+ LMCache, + the FX array) for one arm on a node, tear it down, and collect what comes back.

The node-side work is plain bash in runners/remote/ (deploy.sh, attach_fx.sh); this module validates the
pilot's deployment settings, renders the per-arm files, ships them by SFTP, starts the server detached,
waits for /health from the node itself (the server listens on the node's loopback) and keeps the rendered
config, the server log and the run manifest as artifacts.
"""
from __future__ import annotations

import json
import re
import secrets
import shlex
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runners import detached, ssh
from runners.artifacts import ArtifactMismatch, EvidenceStoreError, store_bytes
from runners.config import ARMS, DEFAULT_SIMULATED, DeploymentSettings, shell_env_file, validate_deployment
from runners.models import Artifact, Job, Node, Step, describe_holder, lease_holder
from runners.output import system_line

REMOTE_DIR = Path(__file__).resolve().parent / "remote"
SCRIPTS = ("deploy.sh", "attach_fx.sh", "workload.py")
HEALTH_POLL_S = 5           # one SSH command waits at most this long; between looks: cancel, the log, progress
HEALTH_PROGRESS_S = 30      # how often the wait says how long it has waited
LOG_TAIL_LINES = 40
# The node's own server: its loopback or the fabric address it was deployed on (deployment.fabric_addresses).
_METRICS_URL = re.compile(r"^http://(\d{1,3}(\.\d{1,3}){3}|localhost|\[[0-9A-Fa-f:.]+\]):\d{1,5}(/[A-Za-z0-9_/.-]*)?$")


class DeployError(Exception):
    """A deploy, teardown or collection that could not be done; the message says why and where."""

    def __init__(self, message: str, *, deployment: Deployment | None = None, log_tail: str = "") -> None:
        self.deployment = deployment
        self.log_tail = log_tail
        super().__init__(message + (f"\n--- last lines of the server log ---\n{log_tail}" if log_tail else ""))


@dataclass
class Deployment:
    """One server of one arm on one node; stored in step.result["deployment"] so any worker can tear it down."""

    run_id: str
    arm: str
    node: str
    deploy_id: str
    run_dir: str
    arm_dir: str
    port: int = 0
    config_path: str | None = None
    server: dict = field(default_factory=dict)
    fx_user: str | None = None
    share_pool: bool = False
    simulated: bool = False
    healthy: bool = False
    torn_down: bool = False
    host: str = "127.0.0.1"         # where the server listens: the node's loopback or its fabric address
    log_checked: dict = field(default_factory=dict)  # server log path → bytes already looked at for LMCache trouble

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def instance(self) -> str:
        return f"{self.node}:{self.port}"

    @property
    def name_prefix(self) -> str:
        """Artifact names of this deployment: node/arm-id/..."""
        return f"{self.node}/{self.arm}-{self.deploy_id}"

    @property
    def bin_dir(self) -> str:
        return f"{self.run_dir}/bin"

    @property
    def workload(self) -> str:
        """The workload client shipped with the scripts (runners/remote/workload.py)."""
        return f"{self.bin_dir}/workload.py"

    @property
    def records_dir(self) -> str:
        """Where the workload's records and summaries go; collect_deployment fetches everything in it."""
        return f"{self.arm_dir}/records"

    @property
    def metrics_dir(self) -> str:
        return f"{self.arm_dir}/metrics"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Deployment:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})


def settings_for(job: Job, node: Node) -> DeploymentSettings:
    """The pilot's deployment settings, validated; a simulated node with none set gets DEFAULT_SIMULATED."""
    data = job.pilot.deployment
    if not data and node.simulated:
        data = DEFAULT_SIMULATED
    return validate_deployment(data)


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


def cache_dirs(settings: DeploymentSettings, arm: str, run_id: str | None) -> tuple[str | None, str | None]:
    """(LMCache local_disk directory, shared fs pool directory) of an arm; the cache arms differ only in the root."""
    suffix = f"/{run_id}" if run_id else ""
    if arm == "local_nvme":
        return f"{settings.paths.local_nvme_path}/kv{suffix}", None
    if arm == "fx":
        return f"{settings.paths.fx_mount}/fxpilot/kv{suffix}", f"{settings.paths.shared_pool}{suffix}"
    return None, None


def render_lmcache_config(settings: DeploymentSettings, arm: str, *, run_id: str | None = None, share_pool: bool = False,
                          simulated: bool = False) -> str:
    """The LMCache YAML of an arm: the same backend type and sizes for both cache arms, only the disk path differs."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; arms are {', '.join(ARMS)}")
    header = [f"# LMCache configuration rendered by fxpilot for arm {arm}" + (f", run {run_id}" if run_id else "")]
    if simulated:
        header.append("# simulated: true")
    if arm == "recompute":
        return "\n".join(header + ["# recompute: vLLM runs without a KV connector; LMCache is not loaded.", ""])
    for path in (settings.paths.fx_mount, settings.paths.local_nvme_path):
        if path.startswith("~/"):
            raise ValueError(f"{path}: resolve ~/ paths with DeploymentSettings.with_home before rendering")
    disk_dir, pool_dir = cache_dirs(settings, arm, run_id)
    sizes = settings.sizes
    lines = header + [
        "# The CPU tier is kept smaller than the disk tier so that recovered sessions are read back from disk.",
        f"chunk_size: {sizes.chunk_size}",
        "local_cpu: true",
        f"max_local_cpu_size: {sizes.max_local_cpu_size}",
        f"local_disk: {json.dumps('file://' + disk_dir + '/')}",
        f"max_local_disk_size: {sizes.max_local_disk_size}",
    ]
    if share_pool and pool_dir:
        lines += ["# Cross-instance sharing: every instance reads and writes the same pool on the FX mount.",
                  f"remote_url: {json.dumps('fs://localhost:0' + pool_dir)}",
                  'remote_serde: "naive"']
    odirect = "true" if settings.use_odirect else "false"
    # The local-disk backend reads use_odirect; the fs connector of the shared pool reads its own key.
    lines += ["extra_config:", f"  use_odirect: {odirect}"]
    if share_pool and pool_dir:
        lines.append(f"  fs_connector_use_odirect: {odirect}")
    return "\n".join(lines + [""])


def _fx_params(settings: DeploymentSettings, run_dir: str) -> dict[str, Any]:
    target = settings.fx_target
    return {"FX_ADDRESS": target.address, "FX_SERVICE_ID": target.service_id, "FX_NQN": target.nqn,
            "FX_HOST_NQN": target.host_nqn, "FX_FSTYPE": target.fstype, "FX_MOUNT": settings.paths.fx_mount,
            "MKFS_IF_EMPTY": settings.mkfs_if_empty, "RUN_DIR": run_dir}


def _save(step: Step | None, deployment: Deployment) -> None:
    if step is None:
        return
    step.refresh_from_db(fields=["result"])
    result = dict(step.result or {})
    result["deployment"] = deployment.to_dict()
    step.result = result
    step.save(update_fields=["result"])


def _say(job: Job, step: Step | None, node: Node, text: str) -> None:
    system_line(job, f"[{node.name}] {text}", step=step)


def _error_lines(exc: ssh.CommandFailed) -> str:
    """The `fxpilot: error:` lines a remote script printed, else the tail of its stderr."""
    lines = [line.split("fxpilot: error: ", 1)[1] for line in exc.stderr_tail.splitlines() if "fxpilot: error: " in line]
    return "; ".join(lines) if lines else " | ".join(exc.stderr_tail.strip().splitlines()[-5:])


def run_id_of(job: Job) -> str:
    return job.code.hex[:12]


def deploy_arm(job: Job, step: Step | None, node: Node, arm: str, *, time_scale: float | None = None,
               share_pool: bool = False) -> Deployment:
    """Ship, attach FX when the arm needs it, start the server detached and wait for /health; tear down on failure."""
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
                                arm_dir="", share_pool=share_pool and arm == "fx", simulated=node.simulated,
                                host=settings.bind_address(node.name))
        deployment.arm_dir = f"{run_dir}/{arm}-{deployment.deploy_id}"
        try:
            _deploy(job, step, node, conn, settings, deployment, time_scale)
        except Exception as exc:
            # Whatever stopped the deploy (a time limit included), what it started is stopped too.
            _say(job, step, node, f"deploy of {arm} failed; tearing down")
            try:
                teardown_arm(job, step, node, deployment)
            except (ssh.SSHError, DeployError) as teardown_exc:
                _say(job, step, node, f"teardown after the failed deploy also failed: {teardown_exc}")
            if isinstance(exc, DeployError):
                exc.deployment = deployment
                raise
            if isinstance(exc, ssh.SSHError):
                raise DeployError(str(exc), deployment=deployment) from exc
            raise
    return deployment


def _deploy(job: Job, step: Step | None, node: Node, conn: ssh.NodeConnection, settings: DeploymentSettings,
            deployment: Deployment, time_scale: float | None) -> None:
    arm = deployment.arm
    conn.mkdirs(deployment.bin_dir)
    for directory in (deployment.arm_dir, deployment.records_dir, deployment.metrics_dir):
        conn.mkdirs(directory)
    _save(step, deployment)
    for script in SCRIPTS:
        conn.upload((REMOTE_DIR / script).read_bytes(), f"{deployment.bin_dir}/{script}", mode=0o755)
    conn.upload(shell_env_file(_fx_params(settings, deployment.run_dir)).encode(), f"{deployment.run_dir}/fx.env")

    config = render_lmcache_config(settings, arm, run_id=deployment.run_id, share_pool=deployment.share_pool,
                                   simulated=node.simulated)
    store_bytes(job, f"{deployment.name_prefix}/lmcache.yaml", config.encode(), kind="config", step=step, node=node,
                simulated=node.simulated)
    if arm != "recompute" and settings.kv_connector == "LMCacheConnectorV1":
        deployment.config_path = f"{deployment.arm_dir}/lmcache.yaml"
        conn.upload(config.encode(), deployment.config_path)

    disk_dir, pool_dir = cache_dirs(settings, arm, deployment.run_id)
    params = {
        "RUN_ID": deployment.run_id, "ARM": arm, "NODE": node.name, "SIMULATED": node.simulated,
        "MODEL": settings.model, "TP": settings.tensor_parallel_size, "PORT": settings.ports.for_arm(arm),
        "BIND_HOST": deployment.host,
        "CACHE_DIR": disk_dir, "SHARED_DIR": pool_dir if deployment.share_pool else None,
        "KV_CONFIG_PATH": deployment.config_path, "USE_ODIRECT": settings.use_odirect,
        "DROP_PAGE_CACHE": settings.drop_page_cache, "PAGE_CACHE_METHOD": settings.page_cache_method,
        "MAX_LOCAL_DISK_SIZE": settings.sizes.max_local_disk_size, "EXTRA_VLLM_FLAGS": list(settings.extra_vllm_flags),
        "SIM_TIME_SCALE": time_scale if (node.simulated and time_scale) else None,
        "KV_CONNECTOR": settings.kv_connector if arm != "recompute" else "",
        **settings.launcher.params(),
    }
    conn.upload(shell_env_file(params).encode(), f"{deployment.arm_dir}/params.env")

    if arm == "fx":
        deployment.fx_user = f"{arm}-{deployment.deploy_id}"
        _save(step, deployment)
        _script(conn, job, step, node, deployment, "attach_fx.sh", "attach", f"{deployment.run_dir}/fx.env",
                deployment.fx_user, what="attaching the FX array")

    out = _script(conn, job, step, node, deployment, "deploy.sh", "preflight", deployment.arm_dir, what="preflight")
    match = re.search(r"^FXPILOT_PORT=(\d+)$", out, re.MULTILINE)
    if not match:
        raise DeployError(f"node {node.name}: preflight printed no port", deployment=deployment)
    deployment.port = int(match.group(1))
    _save(step, deployment)

    command = f"exec bash {ssh.shell_path(deployment.bin_dir + '/deploy.sh')} serve {ssh.shell_path(deployment.arm_dir)}"
    deployment.server = detached.start(conn, f"{deployment.arm_dir}/server", command, job=job, step=step).to_dict()
    _save(step, deployment)
    _say(job, step, node, f"{arm}: server starting on port {deployment.port} (pid {deployment.server.get('pid')})")
    _wait_healthy(job, step, node, conn, settings, deployment)
    deployment.healthy = True
    _save(step, deployment)
    _say(job, step, node, f"{arm}: healthy at {deployment.url}")


def _script(conn: ssh.NodeConnection, job: Job, step: Step | None, node: Node, deployment: Deployment, script: str,
            *args: str, what: str) -> str:
    quoted = [ssh.shell_path(a) if a.startswith(("/", "~/")) else shlex.quote(a) for a in args]
    command = " ".join([f"bash {ssh.shell_path(deployment.bin_dir + '/' + script)}", *quoted])
    try:
        return conn.run(command, job=job, step=step, timeout=600).stdout
    except ssh.CommandFailed as exc:
        raise DeployError(f"node {node.name}: {deployment.arm}: {what} failed: {_error_lines(exc)}",
                          deployment=deployment) from None


def _wait_healthy(job: Job, step: Step | None, node: Node, conn: ssh.NodeConnection, settings: DeploymentSettings,
                  deployment: Deployment) -> None:
    """Wait for /health from the node, a few seconds per look. Between looks: a cancel of the run stops the
    wait (the caller tears the server down), the server log's new lines go to the run's live log, and every
    HEALTH_PROGRESS_S the wait says how long it has waited. deploy.sh exits 5 when the server answers but its
    log shows LMCache failing to initialise or running degraded: the deploy fails with that line."""
    started = time.monotonic()
    deadline = started + settings.health_timeout_s
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
        _save(step, deployment)
        if result.exit_code == 0:
            return
        if result.exit_code == 5:
            reason = _error_lines_of(result.stderr_tail) or "LMCache did not initialise"
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
                              f"{settings.health_timeout_s} s (deployment.health_timeout_s)", deployment=deployment,
                              log_tail=server_log_tail(conn, deployment))
        if now - said >= HEALTH_PROGRESS_S:
            said = now
            _say(job, step, node, f"{deployment.arm}: waiting for /health on port {deployment.port}: "
                                  f"{now - started:.0f} s of {settings.health_timeout_s} s")


def _cancel_requested(job: Job) -> bool:
    return Job.objects.filter(pk=job.pk, cancel_requested=True).exists()


def _error_lines_of(stderr: str) -> str:
    lines = [line.split("fxpilot: error: ", 1)[1] for line in stderr.splitlines() if "fxpilot: error: " in line]
    return "; ".join(lines)


def server_log_paths(deployment: Deployment) -> list[str]:
    """Where the detached server's output went (runners.detached keeps stdout and stderr apart)."""
    server = deployment.server or {}
    return [server[key] for key in ("stdout", "stderr") if server.get(key)]


# LMCache that fails does not stop vLLM: the server stays healthy and every request recomputes (after waiting
# for a lookup timeout). These are the lines LMCache 0.5.x writes then (lmcache/v1/manager.py,
# health_monitor/base.py, health_monitor/checks/remote_backend_check.py, gpu_connector/__init__.py). The same
# extended regular expression is deploy.sh's LMCACHE_FAILED, read at /health; this one is read during the run.
LMCACHE_TROUBLE = (
    r"System will operate in degraded mode|entering degraded mode|No supported [A-Za-z]+ connector found"
    r"|Failed to initiali[sz]e LMCache|Failed during post_init|LMCacheConnectorV1.*(Error|Exception):"
    r"|LMCache (ERROR|WARNING):.*([Cc]onnection (refused|reset|lost|error|closed|timed out)|[Ff]ailed to connect"
    r"|Ping (error|timeout))"
)
# Run with the node's python3: the complete lines of each log from where the last look stopped, colour codes
# removed, searched for the first match. A line still being written is left for the next look, so no line is
# read in halves and none twice (a fault step's lines, passed over, are never read again).
_SCAN_LOG = r"""
import json, os, re, sys
pattern, ansi = re.compile(sys.argv[1]), re.compile(r"\x1b\[[0-9;]*m")
out = {"checked": {}, "line": None}
for path, start in json.loads(sys.argv[2]).items():
    try:
        handle = open(os.path.expanduser(path), "rb")
    except OSError:
        continue
    with handle:
        size = handle.seek(0, 2)
        start = start if 0 <= start <= size else 0
        handle.seek(start)
        done, rest = start, b""
        while done + len(rest) < size:
            block = handle.read(min(8 << 20, size - done - len(rest)))
            if not block:
                break
            lines = (rest + block).split(b"\n")
            rest = lines.pop()
            for raw in lines:
                done += len(raw) + 1
                if out["line"] is None:
                    text = ansi.sub("", raw.decode("utf-8", "replace"))
                    if pattern.search(text):
                        out["line"] = text.strip()[:600]
    out["checked"][path] = done
print(json.dumps(out))
"""


def lmcache_trouble(conn: ssh.NodeConnection, deployment: Deployment) -> str | None:
    """The first server log line, since what an earlier look read (deployment.log_checked), that shows LMCache
    failing to initialise, running degraded or losing a connection; None when there is none or the arm runs
    without LMCache. Advances deployment.log_checked (store it with save_log_checked)."""
    if not deployment.config_path:
        return None
    paths = server_log_paths(deployment)
    if not paths:
        return None
    starts = {path: int(deployment.log_checked.get(path, 0)) for path in paths}
    result = conn.run(f"python3 -c {shlex.quote(_SCAN_LOG)} {shlex.quote(LMCACHE_TROUBLE)} "
                      f"{shlex.quote(json.dumps(starts))}", echo=False, timeout=120)
    try:
        found = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DeployError(f"node {deployment.node}: reading the {deployment.arm} server log gave "
                          f"{result.stdout[-200:]!r}", deployment=deployment) from None
    checked = {path: int(value) for path, value in (found.get("checked") or {}).items() if path in starts}
    deployment.log_checked = {**deployment.log_checked, **checked}
    return found.get("line") or None


def save_log_checked(step: Step | None, deployment: Deployment) -> None:
    """Keep how far the server log was looked at in the deploy step's stored deployment (that key only)."""
    if step is None:
        return
    step.refresh_from_db(fields=["result"])
    result = dict(step.result or {})
    stored = dict(result.get("deployment") or {})
    if not stored:
        return
    stored["log_checked"] = dict(deployment.log_checked)
    result["deployment"] = stored
    step.result = result
    step.save(update_fields=["result"])


def lmcache_trouble_message(node: Node, deployment: Deployment, line: str, kept: str = "the records already collected") -> str:
    return (f"node {node.name}: {deployment.arm}: LMCache stopped working during the run — the server log says: "
            f"{line[:300]} (infrastructure trouble: {kept} are kept but not judged)")


def server_log_tail(conn: ssh.NodeConnection, deployment: Deployment, lines: int = LOG_TAIL_LINES) -> str:
    paths = server_log_paths(deployment)
    if not paths:
        return ""
    quoted = " ".join(ssh.shell_path(path) for path in paths)
    result = conn.run(f"tail -q -n {int(lines)} -- {quoted} 2>/dev/null", echo=False, check=False, timeout=60)
    return result.stdout.strip()


def run_outcome(job: Job) -> str:
    """How the run stands when its teardown runs: "canceled", "error" or "" (nothing went wrong so far)."""
    state = Job.objects.filter(pk=job.pk).values("cancel_requested", "error", "status").first() or {}
    if state.get("cancel_requested") or state.get("status") == "canceled":
        return "canceled"
    if state.get("error") or state.get("status") == "error":
        return "error"
    return ""


class _Parts:
    """Runs each part of a teardown whatever happened to the parts before it, and keeps every failure.

    A connection lost in one part is opened again for the next; a node that cannot be reached at all
    ends the remaining parts with that reason (and the step is retried by the orchestrator).
    """

    def __init__(self, node: Node, conn: ssh.NodeConnection) -> None:
        self.node, self.conn, self.problems = node, conn, []
        self.transient = True  # every failure so far was the node being away (worth the whole teardown again)

    def run(self, what: str, action) -> Any:
        if self.conn is None:
            try:
                self.conn = ssh.connect(self.node)
            except ssh.SSHError as exc:
                self.problems.append(f"{what}: {exc}")
                self.transient &= exc.transient
                return None
        try:
            return action(self.conn)
        except Exception as exc:  # noqa: BLE001 — a teardown part that fails must not stop the next one
            self.problems.append(f"{what}: {_problem(exc)}")
            self.transient &= ssh.is_transient(exc) or (
                isinstance(exc, DeployError) and isinstance(exc.__cause__, ssh.SSHError) and exc.__cause__.transient)
            if isinstance(exc, ssh.ConnectionLost):
                self.conn.close()
                self.conn = None
            return None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def _problem(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if isinstance(exc, (ssh.SSHError, DeployError, ArtifactMismatch, EvidenceStoreError)) else f"{type(exc).__name__}: {text}"


def teardown_arm(job: Job, step: Step | None, node: Node, deployment: Deployment | Mapping[str, Any], *,
                 purge_cache: bool = False) -> Deployment:
    """Stop the server, keep its logs and what the node recorded, detach FX, clean caches. Safe to call again.

    Every part runs even when an earlier one failed; the DeployError raised at the end names every failure.
    When the run has ended in error or was canceled, the records, summaries and metrics the node wrote are
    kept too, marked with that outcome. The FX attachment is detached only when no other run holds the node.
    """
    if isinstance(deployment, Mapping):
        deployment = Deployment.from_dict(deployment)
    outcome = run_outcome(job)
    try:
        conn = ssh.connect(node)
    except ssh.SSHError as exc:
        if exc.transient:
            raise  # the node may answer in a moment: the orchestrator tries the teardown again
        raise DeployError(f"node {node.name}: {deployment.arm}: teardown not done: the node cannot be reached "
                          f"({exc}); its server, FX attachment and caches are left as they were",
                          deployment=deployment) from None
    parts = _Parts(node, conn)
    try:
        if deployment.server:
            parts.run("stopping the server", lambda conn: detached.cancel(conn, deployment.server))
            parts.run("keeping the server logs", lambda conn: _keep_server_logs(job, step, node, conn, deployment))
        if outcome and deployment.arm_dir:
            kept = parts.run("keeping what the node recorded",
                             lambda conn: _keep_recorded(job, step, node, conn, deployment, outcome))
            if kept:
                _say(job, step, node, f"{deployment.arm}: kept {len(kept)} file(s) the node recorded before the run "
                                      f"ended ({outcome}): {', '.join(a.name for a in kept)}")
        if deployment.fx_user:
            holder = lease_holder(node)
            if holder is not None and holder.pk != job.pk:
                _say(job, step, node, f"{deployment.arm}: the FX array is left attached: node {node.name} is now held "
                                      f"by {describe_holder(holder, job)}")
            else:
                parts.run("detaching the FX array", lambda conn: _script(
                    conn, job, step, node, deployment, "attach_fx.sh", "detach", f"{deployment.run_dir}/fx.env",
                    deployment.fx_user, what="detaching the FX array"))
        if purge_cache and deployment.arm_dir:
            parts.run("cleaning the cache", lambda conn: _script(conn, job, step, node, deployment, "deploy.sh", "cleanup",
                                                                 deployment.arm_dir, what="cache cleanup"))
    finally:
        parts.close()
    deployment.torn_down = not parts.problems
    try:
        _save(step, deployment)
    except Exception as exc:  # noqa: BLE001
        parts.problems.append(f"recording the teardown: {_problem(exc)}")
    if parts.problems:
        message = (f"{deployment.arm}: teardown incomplete ({len(parts.problems)} part(s) failed): "
                   + "; ".join(parts.problems))
        if parts.transient:
            # Only the node being away stopped it (an SSH outage): the orchestrator runs the teardown again later.
            raise ssh.ConnectionLost(message, node=node)
        raise DeployError(f"node {node.name}: {message}", deployment=deployment)
    _say(job, step, node, f"{deployment.arm}: torn down")
    return deployment


def _keep_server_logs(job: Job, step: Step | None, node: Node, conn: ssh.NodeConnection, deployment: Deployment,
                      problems: list[str] | None = None) -> list[Artifact]:
    """Every server log, each tried even when another failed; raises DeployError naming the ones that failed."""
    kept, failed = [], []
    for path in server_log_paths(deployment):
        name = f"{deployment.name_prefix}/{path.rsplit('/', 1)[-1]}"
        if not name.endswith(".log"):
            name = f"{deployment.name_prefix}/server.{path.rsplit('/', 1)[-1]}.log"
        try:
            if conn.run(f"test -f {ssh.shell_path(path)}", echo=False, check=False, timeout=30).exit_code != 0:
                continue
            kept.append(conn.download(path, job=job, name=name, kind="server-log", step=step))
        except ssh.ConnectionLost:
            raise
        except Exception as exc:  # noqa: BLE001 — e.g. the store is full: the next log is still tried
            failed.append(f"keeping the server log {path}: {_problem(exc)}")
    if failed:
        if problems is not None:
            problems.extend(failed)
        else:
            raise DeployError("; ".join(failed), deployment=deployment)
    return kept


def _recorded_files(conn: ssh.NodeConnection, deployment: Deployment) -> dict[str, str]:
    """Node path → artifact name of what collect_deployment fetches: manifest, FX attach record, records/, metrics/."""
    listing = conn.run(f"cd {ssh.shell_path(deployment.arm_dir)} 2>/dev/null && find records metrics -type f "
                       f"2>/dev/null; true", echo=False, timeout=60).stdout.split()
    mapping = {f"{deployment.arm_dir}/{rel}": f"{deployment.name_prefix}/{rel}"
               for rel in ["manifest.json", *sorted(listing)] if not rel.endswith(".part")}
    if conn.run(f"test -f {ssh.shell_path(deployment.run_dir + '/fx-attach.json')}", echo=False, check=False,
                timeout=30).exit_code == 0:
        # The attach record is rewritten for each arm, so it is kept per arm.
        mapping[f"{deployment.run_dir}/fx-attach.json"] = f"{deployment.name_prefix}/fx-attach.json"
    return mapping


def _keep_recorded(job: Job, step: Step | None, node: Node, conn: ssh.NodeConnection, deployment: Deployment,
                   outcome: str) -> list[Artifact]:
    """What the node recorded and no step collected yet, kept with the run's outcome (every file tried)."""
    have = set(Artifact.objects.filter(job=job, name__startswith=deployment.name_prefix + "/").values_list("name", flat=True))
    kept, failed = [], []
    for path, name in _recorded_files(conn, deployment).items():
        if name in have:
            continue
        if conn.run(f"test -f {ssh.shell_path(path)}", echo=False, check=False, timeout=30).exit_code != 0:
            continue
        try:
            kept.append(conn.download(path, job=job, name=name, kind=_kind(path), step=step, outcome=outcome))
        except ssh.ConnectionLost:
            raise
        except Exception as exc:  # noqa: BLE001
            failed.append(f"{path}: {_problem(exc)}")
    if failed:
        raise DeployError(f"kept {len(kept)} file(s), but " + "; ".join(failed), deployment=deployment)
    return kept


def fx_path_intact(conn: ssh.NodeConnection, deployment: Deployment) -> str | None:
    """None when the FX mount this run attached is still the mount it attached; otherwise what is wrong, in words.

    Gone, detached, or unmounted and mounted again meanwhile (a new mount ID, as findmnt shows it): whatever
    the run measured on FX may have missed its cache for a reason outside the run.
    """
    res = conn.run(f"cat {ssh.shell_path(deployment.run_dir + '/fx-attach.json')} 2>/dev/null", echo=False, check=False,
                   timeout=30)
    try:
        record = json.loads(res.stdout or "{}")
    except ValueError:
        return "the FX attach record on the node cannot be read"
    mount = record.get("mount")
    if not mount or record.get("detached") is True:
        return "the FX array was detached before the run was done with it" if mount else None
    listing = conn.run("mount", echo=False, check=False, timeout=30).stdout
    if not any(len(parts) >= 3 and parts[1] == "on" and parts[2] == mount for parts in map(str.split, listing.splitlines())):
        return f"the FX mount {mount} is no longer mounted"
    attached_as = str(record.get("mount_id") or "")
    if attached_as:
        now = conn.run(f"findmnt -rn -o ID --mountpoint {ssh.shell_path(mount)} 2>/dev/null | head -n 1", echo=False,
                       check=False, timeout=30).stdout.strip()
        if now and now != attached_as:
            return (f"the FX mount {mount} was unmounted and mounted again while the run used it (mount ID "
                    f"{attached_as} when attached, {now} now)")
    return None


_KINDS = ((".summary.json", "phase-summary"), (".jsonl", "records"), ("manifest.json", "manifest"), (".log", "server-log"),
          (".prom", "metrics"), (".yaml", "config"), ("fx-attach.json", "fx-attach"))


def _kind(path: str) -> str:
    return next((kind for suffix, kind in _KINDS if path.endswith(suffix)), "raw")


def collect(job: Job, step: Step | None, node: Node, remote_paths: Iterable[str] | Mapping[str, str], *,
            deployment: Deployment | None = None) -> list[Artifact]:
    """Fetch files from a node as artifacts (SHA-256 on the node and here); missing files are named, not fatal first.

    remote_paths is a list of node paths (named node/<file name>, or relative to the deployment's arm directory)
    or a mapping of node path → artifact name. Idempotent: a file fetched again with the same bytes is the same artifact.
    """
    items = remote_paths.items() if isinstance(remote_paths, Mapping) else [(path, None) for path in remote_paths]
    collected, missing, problems = [], [], []
    with ssh.connect(node) as conn:
        for path, name in items:
            if name is None:
                prefix = deployment.name_prefix if deployment else node.name
                base = deployment.arm_dir + "/" if deployment else None
                name = f"{prefix}/{path[len(base):] if base and path.startswith(base) else path.rsplit('/', 1)[-1]}"
            if conn.run(f"test -f {ssh.shell_path(path)}", echo=False, check=False, timeout=30).exit_code != 0:
                missing.append(path)
                continue
            try:
                collected.append(conn.download(path, job=job, name=name, kind=_kind(path), step=step))
            except (ssh.SSHError, ArtifactMismatch, EvidenceStoreError) as exc:
                problems.append(f"{path}: {exc}")  # a full store: named; the files stored before are kept
    if missing or problems:
        detail = "; ".join(([f"missing: {', '.join(missing)}"] if missing else []) + problems)
        raise DeployError(f"node {node.name}: collected {len(collected)} file(s), but {detail}",
                          deployment=deployment) from None
    return collected


def collect_deployment(job: Job, step: Step | None, node: Node, deployment: Deployment,
                       extra: Iterable[str] = ()) -> list[Artifact]:
    """The manifest, the FX attach record and every file under the arm directory's records/ and metrics/.

    For an arm on the FX array, the FX path is checked after the files are kept: when it was lost meanwhile (a
    reason outside this run: another party detached or unmounted it), DeployError says so — an infrastructure
    error, so the data is kept but never judged. So does a server log whose lines since the workload's last look
    show LMCache degraded, failing to initialise or losing a connection (lmcache_trouble).
    """
    with ssh.connect(node) as conn:
        mapping = _recorded_files(conn, deployment)
    mapping.update({path: f"{deployment.name_prefix}/{path.rsplit('/', 1)[-1]}" for path in extra})
    collected = collect(job, step, node, mapping, deployment=deployment)
    with ssh.connect(node) as conn:
        # what the server logged after the workload's last look (or all of it, when nothing looked yet)
        trouble = lmcache_trouble(conn, deployment)
    if trouble:
        raise DeployError(lmcache_trouble_message(node, deployment, trouble, f"the {len(collected)} file(s) collected"),
                          deployment=deployment)
    if deployment.fx_user:
        with ssh.connect(node) as conn:
            lost = fx_path_intact(conn, deployment)
        if lost:
            raise DeployError(f"node {node.name}: {deployment.arm}: {lost} — interference from outside this run; the "
                              f"{len(collected)} file(s) collected are kept but not judged", deployment=deployment)
    return collected


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {sample name with labels: value}, plus each family's sum over labels under its bare name."""
    values: dict[str, float] = {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        name, labels = match.group(1), match.group(2) or ""
        values[name + labels] = value
        if labels:
            sums[name] = sums.get(name, 0.0) + value
    for name, total in sums.items():
        values.setdefault(name, total)
    return values


def metrics_snapshot(node: Node, url: str, *, job: Job | None = None, step: Step | None = None,
                     name: str | None = None) -> dict[str, float]:
    """GET /metrics from the node itself; parsed into numbers, and kept as an artifact when a job and name are given."""
    if not _METRICS_URL.match(url):
        raise DeployError(f"node {node.name}: {url!r} is not a loopback http URL of the node's server")
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    script = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())"
    try:
        result = ssh.run(node, f"python3 -c {shlex.quote(script)} {shlex.quote(url)}", timeout=90)
    except ssh.CommandFailed as exc:
        raise DeployError(f"node {node.name}: cannot read {url}: {_error_lines(exc)}") from None
    text = result.stdout
    if job is not None and name:
        store_bytes(job, name, text.encode(), kind="metrics", step=step, node=node, simulated=node.simulated)
    return parse_metrics(text)
