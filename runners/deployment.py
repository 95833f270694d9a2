"""One arm's deployment on a node as every part of its life sees it: the `Deployment` record (stored in the
deploy step's result, so any worker can tear it down), `DeployError`, the pilot's settings for a node, and the
small helpers the deploy, the collection and the teardown share (saying, saving, running a shipped script,
reading the server log's tail). The jobs themselves: runners.deploy (start and wait for /health),
runners.lmcache (the LMCache configuration and log watch), runners.collect, runners.teardown.
"""
from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from django.utils.dateparse import parse_datetime

from runners import ssh
from runners.artifacts import ArtifactMismatch, EvidenceStoreError
from runners.config import (
    DEFAULT_SIMULATED,
    DeploymentSettings,
    DeploymentSettingsError,
    health_timeout,
    validate_deployment,
)
from runners.models import Job, Node, Step
from runners.output import system_line

LOG_TAIL_LINES = 40


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
    capacity_tokens: int | None = None  # G4's capacity check: the fx disk tier capped at this many tokens
    simulated: bool = False
    healthy: bool = False
    torn_down: bool = False
    host: str = "127.0.0.1"         # where the server listens: the node's loopback or its fabric address
    log_checked: dict = field(default_factory=dict)  # server log path → bytes already looked at for LMCache trouble
    cold_start_measured: bool = False  # G1's cold start: empty compile caches, the start measured on the node
    # recompute with vLLM's own prefix cache on (G4: the customer's alternative without a KV tier); off elsewhere
    prefix_caching: bool = False
    cold_start: dict = field(default_factory=dict)    # what deploy.sh measured (seconds, caches, measured_at, …)
    health_timeout_s: int = 0       # how long this deploy waited at most for /health (runners.config.health_timeout)
    # LMCache's internal API servers, one per TP worker (127.0.0.1): the workload client empties the DRAM tier
    # through them before a cold window (DELETE <url>/cache/clear?locations=LocalCPUBackend)
    lmcache_api_urls: list = field(default_factory=list)
    disk_device: str | None = None  # the disk tier's block device, its /proc/diskstats name (local_nvme, fx)
    none_hash: dict = field(default_factory=dict)       # {expected, observed: [{process, value}]} (LMCache arms)
    odirect_observed: list = field(default_factory=list)  # [{process, value}]: "Using O_DIRECT for disk I/O" lines
    lmcache_fingerprint: dict | None = None  # lmcache_inspect.py's {sha256, version, commit, disk_io_threads, …}
    sizing: dict = field(default_factory=dict)          # the sizing preflight (runners.lmcache.sizing)

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
    return settings_of_pilot(job.pilot, node)


def settings_of_pilot(pilot, node: Node) -> DeploymentSettings:
    data = pilot.deployment
    if not data and node.simulated:
        data = DEFAULT_SIMULATED
    return validate_deployment(data)


def start_up(pilot, node: Node) -> dict[str, Any]:
    """What the node page says about starting the planned model: G1's measured cold start (`cold_start`, with its
    model-time seconds on a simulated node), and the /health wait of the node's next deploy (`timeout`, a
    runners.config.HealthTimeout, at the time scale the cold start was measured at), or the settings' `error`."""
    measured = dict(node.cold_start or {})
    if all(isinstance(measured.get(key), (int, float)) and measured[key] > 0 for key in ("seconds", "time_scale")):
        measured["model_seconds"] = float(measured["seconds"]) / float(measured["time_scale"])
    if isinstance(measured.get("measured_at"), str):
        measured["measured_at"] = parse_datetime(measured["measured_at"])
    try:
        settings = settings_of_pilot(pilot, node)
    except DeploymentSettingsError as exc:
        return {"cold_start": measured, "timeout": None, "error": str(exc)}
    return {"cold_start": measured, "settings": settings,
            "timeout": health_timeout(settings, node.cold_start, time_scale=measured.get("time_scale"))}


def save_deployment(step: Step | None, deployment: Deployment) -> None:
    if step is None:
        return
    step.refresh_from_db(fields=["result"])
    result = dict(step.result or {})
    result["deployment"] = deployment.to_dict()
    step.result = result
    step.save(update_fields=["result"])


def say(job: Job, step: Step | None, node: Node, text: str) -> None:
    system_line(job, f"[{node.name}] {text}", step=step)


def error_lines(exc: ssh.CommandFailed) -> str:
    """The `fxpilot: error:` lines a remote script printed, else the tail of its stderr."""
    lines = [line.split("fxpilot: error: ", 1)[1] for line in exc.stderr_tail.splitlines() if "fxpilot: error: " in line]
    return "; ".join(lines) if lines else " | ".join(exc.stderr_tail.strip().splitlines()[-5:])


def error_lines_of(stderr: str) -> str:
    lines = [line.split("fxpilot: error: ", 1)[1] for line in stderr.splitlines() if "fxpilot: error: " in line]
    return "; ".join(lines)


def run_id_of(job: Job) -> str:
    return job.code.hex[:12]


def run_script(conn: ssh.NodeConnection, job: Job, step: Step | None, node: Node, deployment: Deployment, script: str,
            *args: str, what: str) -> str:
    quoted = [ssh.shell_path(a) if a.startswith(("/", "~/")) else shlex.quote(a) for a in args]
    command = " ".join([f"bash {ssh.shell_path(deployment.bin_dir + '/' + script)}", *quoted])
    try:
        return conn.run(command, job=job, step=step, timeout=600).stdout
    except ssh.CommandFailed as exc:
        raise DeployError(f"node {node.name}: {deployment.arm}: {what} failed: {error_lines(exc)}",
                          deployment=deployment) from None


def server_log_paths(deployment: Deployment) -> list[str]:
    """Where the detached server's output went (runners.detached keeps stdout and stderr apart)."""
    server = deployment.server or {}
    return [server[key] for key in ("stdout", "stderr") if server.get(key)]


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


def problem(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if isinstance(exc, (ssh.SSHError, DeployError, ArtifactMismatch, EvidenceStoreError)) else f"{type(exc).__name__}: {text}"
