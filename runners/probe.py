"""The G1 probe step: ship probe.sh to a node, run it, keep every raw output as an artifact, parse the inventory.

Synchronous and self-contained: the orchestrator (runners.tasks) calls ``probe_node`` per node and
decides what to retry from the exception (runners.ssh.is_transient).
"""
from __future__ import annotations

import json
import shlex
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings as django_settings
from django.core.exceptions import ValidationError
from django.db import close_old_connections, connection
from django.utils import timezone

from runners import preflight
from runners.artifacts import ArtifactMismatch, store_bytes
from runners.config import DeploymentSettings, DeploymentSettingsError
from runners.deployment import settings_for
from runners.inventory import build_inventory, parse_fx_write
from runners.models import Artifact, Job, Node, Step
from runners.output import system_line
from runners.ssh import DEFAULT_TIMEOUTS, SSHError, Timeouts, TransferMismatch, connect, shell_path
from runners.validators import validate_host, validate_nqn, validate_remote_path

PROBE_SCRIPT = Path(__file__).resolve().parent / "remote" / "probe.sh"
LMCACHE_INSPECT = Path(__file__).resolve().parent / "remote" / "lmcache_inspect.py"  # probe.sh reads it from beside it
PREFLIGHT_SCRIPT = Path(__file__).resolve().parent / "remote" / preflight.SCRIPT_NAME
MAX_RAW_BYTES = 64 * 1024 * 1024


class ProbeSettingsError(ValueError):
    """A deployment setting the probe needs is unusable; names the field."""


@dataclass(frozen=True)
class ProbeSettings:
    fx_mount: str
    local_nvme_path: str
    fx_nqn: str | None
    fx_address: str | None


def probe_settings(deployment: dict | None, *, simulated: bool) -> ProbeSettings:
    """The few deployment settings the probe reads (runners.config validates the whole set).

    Paths may sit under ``paths`` (runners.config) or at the top level; ``~/`` is the SSH user's home.
    """
    deployment = deployment or {}
    paths = deployment.get("paths") or {}
    fx_mount = paths.get("fx_mount") or deployment.get("fx_mount") or ("~/mnt/fx" if simulated else "/mnt/fx")
    local = paths.get("local_nvme_path") or deployment.get("local_nvme_path") or \
        ("~/mnt/nvme0/fxpilot" if simulated else "/mnt/nvme0/fxpilot")
    target = deployment.get("fx_target") or {}
    checks = [("paths.fx_mount", fx_mount, validate_remote_path), ("paths.local_nvme_path", local, validate_remote_path)]
    if target.get("nqn"):
        checks.append(("fx_target.nqn", target["nqn"], validate_nqn))
    if target.get("address"):
        checks.append(("fx_target.address", target["address"], validate_host))
    for name, value, check in checks:
        try:
            check(value)
        except ValidationError as exc:
            raise ProbeSettingsError(f"deployment.{name}: {' '.join(exc.messages)}") from None
    return ProbeSettings(fx_mount=fx_mount.rstrip("/") or "/", local_nvme_path=local.rstrip("/") or "/",
                         fx_nqn=target.get("nqn"), fx_address=target.get("address"))


class NodeNotReady(preflight.NodeNotReady, ProbeSettingsError):
    """The preflight found blockers: the node cannot run the gate (an infrastructure error, never a verdict)."""


def vllm_launch(deployment: DeploymentSettings) -> tuple[str, ...]:
    """The words that run ``vllm`` on a node, as deploy.sh runs them: from the PATH, or as the deployment's
    launcher says (a venv's bin, ``conda run`` in an environment, or behind a prefix such as ``docker run … IMAGE``).
    Settings without a launcher mean the PATH."""
    launcher = getattr(deployment, "launcher", None)
    kind = getattr(launcher, "kind", "") or ""
    if kind == "venv":
        return (f"{launcher.venv.rstrip('/')}/bin/vllm",)
    if kind == "conda":
        return ("conda", "run", "--no-capture-output", "-p" if launcher.conda.startswith("/") else "-n",
                launcher.conda, "vllm")
    if kind == "prefix":
        return (*launcher.prefix, "vllm")
    return ("vllm",)


def launch_python(deployment: DeploymentSettings) -> str | None:
    """The interpreter vLLM and LMCache live in, when the launcher names one on the node's file system (a venv,
    a conda environment given by its path); None means the node's `python3` (a conda environment given by name
    and a container are not looked into: the preflight checks `vllm` through the launcher itself)."""
    launcher = getattr(deployment, "launcher", None)
    kind = getattr(launcher, "kind", "") or ""
    if kind == "venv":
        return f"{launcher.venv.rstrip('/')}/bin/python"
    if kind == "conda" and launcher.conda.startswith("/"):
        return f"{launcher.conda.rstrip('/')}/bin/python"
    return None


def probe_node(node: Node, *, job: Job, step: Step | None = None, fio_runtime: int = 30, fio_size: str = "4G",
               timeouts: Timeouts = DEFAULT_TIMEOUTS) -> dict:
    """Preflight and probe one node; returns the inventory, also saved to Node.inventory and as artifact
    NODE/inventory.json. Raises NodeNotReady, after saving everything, when the preflight found blockers."""
    settings = probe_settings(job.pilot.deployment, simulated=node.simulated)
    try:
        deployment = settings_for(job, node)  # the settings the deploy will use
    except DeploymentSettingsError as exc:
        raise ProbeSettingsError(str(exc)) from None
    if not (1 <= int(fio_runtime) <= 3600) or not fio_size.replace(".", "").rstrip("KMGTkmgt").isdigit():
        raise ProbeSettingsError(f"fio runtime {fio_runtime!r} or size {fio_size!r} is out of range")
    run_dir = f"~/.fxpilot/probe/{job.code.hex[:12]}-{node.pk}"
    out_dir = f"{run_dir}/out"
    launch = vllm_launch(deployment)
    interpreter = launch_python(deployment)
    python = f" --python {shell_path(interpreter)}" if interpreter else ""
    with connect(node, timeouts=timeouts) as conn:
        conn.mkdirs(run_dir)
        conn.upload(PREFLIGHT_SCRIPT.read_bytes(), f"{run_dir}/{preflight.SCRIPT_NAME}", mode=0o755)
        conn.upload(PROBE_SCRIPT.read_bytes(), f"{run_dir}/probe.sh", mode=0o755)
        conn.upload(LMCACHE_INSPECT.read_bytes(), f"{run_dir}/lmcache_inspect.py")
        # the preflight first: its report lands in the probe's folder and travels in the same checked archive
        conn.run(preflight.command(run_dir, out_dir, deployment, vllm=launch), job=job, step=step, timeout=900)
        conn.run(f"bash {shell_path(run_dir + '/probe.sh')} --out {shell_path(out_dir)} --fx-mount {shell_path(settings.fx_mount)} "
                 f"--local-path {shell_path(settings.local_nvme_path)} --fio-size {shlex.quote(fio_size)} "
                 f"--fio-runtime {int(fio_runtime)}{python}", job=job, step=step, timeout=2 * int(fio_runtime) + 600)
        scratch = Path(django_settings.DATA_DIR) / "tmp"
        scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=scratch, prefix="probe-") as folder:
            archive = Path(folder) / "probe-out.tar"
            conn.fetch_to(f"{run_dir}/probe-out.tar", archive)
            files = _unpack(archive, node)
        conn.run(f"rm -rf -- {shell_path(run_dir)}", echo=False, timeout=60)
    artifacts = _store(files, node=node, job=job, step=step)
    raw = {name: files[name] for name in artifacts}
    exit_codes = _index(raw.get("index.tsv", b""))
    fx_path = parse_fx_write(raw.get("fx-write.txt"))["path"] or settings.fx_mount
    inventory = build_inventory(node.name, raw, simulated=node.simulated, fx_mount=fx_path, fx_nqn=settings.fx_nqn,
                                exit_codes=exit_codes)
    inventory["preflight"] = preflight.evaluate(node.name, raw.get(preflight.REPORT_NAME), inventory, deployment,
                                                vllm=launch)
    inventory["artifacts"] = {name: artifact.sha256 for name, artifact in sorted(artifacts.items())}
    store_bytes(job, f"{node.name}/inventory.json", json.dumps(inventory, indent=2, sort_keys=True).encode(),
                kind="inventory", step=step, node=node, simulated=node.simulated)
    Node.objects.filter(pk=node.pk).update(inventory=inventory, inventory_at=timezone.now())
    node.inventory = inventory
    for problem in inventory["problems"]:
        system_line(job, f"[{node.name}] probe: {problem}", step=step)
    blockers = inventory["preflight"]["blockers"]
    for blocker in blockers:
        system_line(job, f"[{node.name}] preflight: {blocker['message']}", step=step)
    if blockers:
        raise NodeNotReady(node.name, blockers)
    return inventory


def probe_nodes(nodes: list[Node], *, job: Job, max_workers: int = 16, **kwargs) -> dict[str, dict | Exception]:
    """Probe several nodes at once (one thread each); node name → inventory, or the exception it raised."""

    def one(node: Node) -> dict | Exception:
        close_old_connections()
        try:
            return probe_node(node, job=job, **kwargs)
        except (SSHError, ProbeSettingsError) as exc:
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(nodes)))) as pool:
        return dict(zip([n.name for n in nodes], pool.map(one, nodes), strict=True))


def _unpack(archive: Path, node: Node) -> dict[str, bytes]:
    """The regular files at the top of the probe archive (nothing else is trusted: no paths, no links)."""
    files = {}
    try:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                name = member.name.removeprefix("./")
                if not member.isfile() or "/" in name or name.startswith(".") or member.size > MAX_RAW_BYTES:
                    raise SSHError(f"probe archive holds an unexpected entry {member.name!r}", node=node)
                files[name] = tar.extractfile(member).read()
    except tarfile.TarError as exc:
        raise SSHError(f"probe archive cannot be read ({exc})", node=node) from None
    if "SHA256SUMS" not in files:
        raise SSHError("probe archive holds no SHA256SUMS", node=node)
    return files


def _store(files: dict[str, bytes], *, node: Node, job: Job, step: Step | None) -> dict[str, Artifact]:
    """Every file listed in SHA256SUMS, kept only if it hashes here to what the node computed."""
    prefix = f"{node.name}/probe/"
    listed = _sha256sums(files["SHA256SUMS"].decode(errors="replace"), node)
    missing = sorted(set(listed) - set(files))
    if missing:
        raise SSHError(f"probe archive lacks {', '.join(missing)} listed in SHA256SUMS", node=node)
    store_bytes(job, prefix + "SHA256SUMS", files["SHA256SUMS"], kind="probe", step=step, node=node,
                simulated=node.simulated)
    stored = {}
    for name, digest in listed.items():
        try:
            stored[name] = store_bytes(job, prefix + name, files[name], kind="probe", step=step, node=node,
                                       simulated=node.simulated, remote_sha256=digest)
        except ArtifactMismatch as exc:
            raise TransferMismatch(str(exc), node=node) from None
    return stored


def _sha256sums(text: str, node: Node) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        name = name.lstrip("*")
        if len(digest) != 64 or not name or "/" in name or name.startswith("."):
            raise SSHError(f"probe SHA256SUMS has an unexpected line: {line[:120]!r}", node=node)
        out[name] = digest
    return out


def _index(raw: bytes) -> dict[str, int]:
    codes = {}
    for line in raw.decode(errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[1].lstrip("-").isdigit():
            codes[parts[0]] = int(parts[1])
    return codes
