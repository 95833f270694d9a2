"""The node preflight of G1: what stops a node from running the gate, all of it at once, before anything is deployed.

runners/remote/preflight.sh reports one finding per line (CHECK, SUBJECT, STATUS, DETAIL); ``evaluate`` turns the
findings and the probe's inventory into a list of blockers. Each blocker keeps its message template and values, so
the portal shows it in the reader's language (``blocker_text``); ``message`` is the English text for logs.
"""
from __future__ import annotations

import shlex
from typing import Any

from django.utils.translation import gettext, gettext_noop

from runners.config import ARMS, DeploymentSettings
from runners.ssh import shell_path

SCRIPT_NAME = "preflight.sh"
REPORT_NAME = "preflight.tsv"

# What to install, as runners.inventory.TOOL_HINTS says it (marked here for translation).
_HINTS = {
    "amd-smi": gettext_noop("install ROCm's amd-smi"), "rocm-smi": gettext_noop("install ROCm's rocm-smi"),
    "nvme": gettext_noop("install nvme-cli"), "fio": gettext_noop("install fio"), "ethtool": gettext_noop("install ethtool"),
    "ibv_devinfo": gettext_noop("install rdma-core's ibverbs-utils"), "rdma": gettext_noop("install iproute2's rdma tool"),
    "ip": gettext_noop("install iproute2"), "mount": gettext_noop("install util-linux"), "python3": gettext_noop("install Python 3"),
    "tar": gettext_noop("install tar"), "sha256sum": gettext_noop("install coreutils"),
    "vllm": gettext_noop("install vLLM or set how it is launched (deployment launch setting)"), "sudo": gettext_noop("install sudo"),
}

MESSAGES = {
    "tool_missing": gettext_noop("`%(tool)s` is not installed on %(node)s: %(hint)s"),
    "sudo_denied": gettext_noop("sudo asks the SSH user of %(node)s for a password (%(detail)s): allow password-less sudo "
                         "for nvme, mount, mkfs.xfs and ip link set (G4 cuts the FX path with it)"),
    "vllm_missing": gettext_noop("vLLM (`%(command)s`) is not found on %(node)s: install it or set how it is launched"),
    "vllm_failed": gettext_noop("`%(command)s --version` fails on %(node)s: %(detail)s"),
    "model_missing": gettext_noop("the model %(model)s is not on %(node)s (looked in %(path)s): download it before the "
                           "gate, which never downloads it"),
    "port_busy": gettext_noop("port %(port)s on %(node)s is already in use: stop what listens there or choose other ports"),
    "fx_unreachable": gettext_noop("the FX target %(target)s is not reachable from %(node)s (%(detail)s)"),
    "fx_not_offered": gettext_noop("the FX target %(target)s does not offer %(nqn)s to %(node)s"),
    "mount_notdir": gettext_noop("%(path)s (%(name)s) on %(node)s exists but is not a folder"),
    "mount_readonly": gettext_noop("%(path)s (%(name)s) on %(node)s is not writable by the SSH user"),
    "mount_blocked": gettext_noop("%(path)s (%(name)s) cannot be created on %(node)s"),
    "mount_absent": gettext_noop("the FX mount point %(path)s does not exist on %(node)s: create it (the deploy never does, "
                          "so that a mistyped path fails)"),
    "gpus_too_few": gettext_noop("%(node)s has %(count)s GPUs; the deployment needs %(needed)s (tensor_parallel_size)"),
    "gpus_mixed": gettext_noop("%(node)s mixes GPU models (%(models)s): one server's tensor-parallel GPUs must be alike"),
    "no_report": gettext_noop("the preflight left no report on %(node)s"),
    "dram_too_big": gettext_noop("deployment.sizes.max_local_cpu_size × tensor_parallel_size asks for %(need)s of LMCache "
                                 "DRAM on %(node)s, above its %(available)s of available memory (MemAvailable): lower "
                                 "max_local_cpu_size or free the memory"),
    "drop_caches_denied": gettext_noop("deployment.drop_page_cache is set, but the workload client drops the page cache "
                                       "as the SSH user of %(node)s without sudo, and %(detail)s: connect as root or "
                                       "use O_DIRECT (use_odirect) instead"),
}


class NodeNotReady(ValueError):
    """A node that cannot run the gate; ``blockers`` lists every reason (runners.preflight)."""

    def __init__(self, node: str, blockers: list[dict]) -> None:
        self.node, self.blockers = node, blockers
        super().__init__(f"{node} cannot run the gate ({len(blockers)} blocker{'s' * (len(blockers) != 1)}): "
                         + "; ".join(b["message"] for b in blockers))


def command(run_dir: str, out_dir: str, settings: DeploymentSettings, *, vllm: tuple[str, ...] = ("vllm",)) -> str:
    """The remote command line; every value comes validated from runners.config and is quoted here."""
    target = settings.fx_target
    parts = [f"bash {shell_path(run_dir + '/' + SCRIPT_NAME)}", f"--out {shell_path(out_dir)}",
             f"--model {shell_path(settings.model) if settings.model.startswith(('/', '~/')) else shlex.quote(settings.model)}",
             f"--fx-mount {shell_path(settings.paths.fx_mount)}", f"--local-path {shell_path(settings.paths.local_nvme_path)}",
             f"--run-root {shell_path(settings.paths.run_root)}", f"--fx-transport {shlex.quote(target.transport)}",
             f"--fx-address {shlex.quote(target.address)}", f"--fx-port {int(target.service_id)}",
             f"--fx-nqn {shlex.quote(target.nqn)}"]
    ports = sorted({settings.ports.for_arm(arm) for arm in ARMS} - {0})
    parts += [f"--port {int(port)}" for port in ports]
    parts += [f"--vllm {shell_path(word) if word.startswith('~/') else shlex.quote(word)}" for word in vllm]
    if settings.kv_connector == "LMCacheConnectorV1":
        parts.append(f"--lmcache-dram-bytes {lmcache_dram_bytes(settings)}")
    if settings.drop_page_cache:
        parts.append("--drop-page-cache")
    return " ".join(parts)


def lmcache_dram_bytes(settings: DeploymentSettings) -> int:
    """LMCache's DRAM tier on a node: max_local_cpu_size GiB (2³⁰ B) for each TP rank."""
    return int(settings.sizes.max_local_cpu_size * 1024 ** 3) * settings.tensor_parallel_size


def _bytes(value: str) -> str:
    try:
        number = int(value)
    except ValueError:
        return value
    return f"{number / 1024 ** 3:.2f} GiB ({number} B)"


def parse_report(raw: bytes | str | None) -> list[dict]:
    """The findings of preflight.tsv: [{"check", "subject", "status", "detail"}]."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else (raw or "")
    rows = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3:
            rows.append({"check": parts[0], "subject": parts[1], "status": parts[2],
                         "detail": parts[3] if len(parts) > 3 else ""})
    return rows


def _blocker(code: str, **params: Any) -> dict:
    params = {k: str(v) for k, v in params.items()}
    return {"code": code, "params": params, "message": MESSAGES[code] % params}


def evaluate(node: str, raw: bytes | str | None, inventory: dict, settings: DeploymentSettings, *,
             vllm: tuple[str, ...] = ("vllm",)) -> dict:
    """{"ok", "blockers", "findings"}: every reason this node cannot run the gate, from the report and the inventory."""
    findings = parse_report(raw)
    if not findings:
        return {"ok": False, "blockers": [_blocker("no_report", node=node)], "findings": []}
    blockers: list[dict] = []
    status = {(f["check"], f["subject"]): f for f in findings}
    missing = {f["subject"] for f in findings if f["check"] == "tool" and f["status"] == "missing"}
    for tool in sorted(missing):
        if tool == "rocm-smi" or (tool == "amd-smi" and "rocm-smi" not in missing):
            continue  # either GPU tool will do; the probe falls back to rocm-smi
        blockers.append(_blocker("tool_missing", tool=tool, node=node, hint=_HINTS.get(tool, gettext_noop("install it"))))
    sudo = status.get(("sudo", "nopasswd"))
    if sudo and sudo["status"] == "denied":
        blockers.append(_blocker("sudo_denied", node=node, detail=sudo["detail"] or "sudo -n true"))
    memory = status.get(("memory", "lmcache"))
    if memory and memory["status"] == "short":
        need, _, available = memory["detail"].partition(" ")
        blockers.append(_blocker("dram_too_big", node=node, need=_bytes(need), available=_bytes(available)))
    drop = status.get(("pagecache", "drop"))
    if drop and drop["status"] == "denied":
        blockers.append(_blocker("drop_caches_denied", node=node, detail=drop["detail"] or "drop_caches is not writable"))
    words = " ".join(vllm)
    if ("vllm", "command") in status:
        blockers.append(_blocker("vllm_missing", command=words, node=node))
    elif status.get(("vllm", "version"), {}).get("status") == "failed":
        blockers.append(_blocker("vllm_failed", command=words, node=node, detail=status[("vllm", "version")]["detail"]))
    for f in findings:
        if f["check"] == "model" and f["status"] == "missing":
            blockers.append(_blocker("model_missing", model=settings.model, node=node, path=f["detail"]))
        elif f["check"] == "port" and f["status"] == "busy":
            blockers.append(_blocker("port_busy", port=f["subject"], node=node))
        elif f["check"] == "fx" and f["status"] == "unreachable":
            target, _, detail = f["detail"].partition(": ")
            blockers.append(_blocker("fx_unreachable", target=target, node=node, detail=detail or f["status"]))
        elif f["check"] == "fx" and f["status"] == "not-offered":
            blockers.append(_blocker("fx_not_offered", target=f["detail"], nqn=settings.fx_target.nqn, node=node))
        elif f["check"] == "mount" and (f["status"] in ("notdir", "readonly", "blocked")
                                        or (f["status"] == "absent" and f["subject"] == "fx_mount")):
            path = f["detail"].split(" (", 1)[0]
            if f["status"] == "absent":
                blockers.append(_blocker("mount_absent", path=path, node=node))
            else:
                blockers.append(_blocker(f"mount_{f['status']}", path=path, name=f["subject"], node=node))
    gpu_tools_missing = {"amd-smi", "rocm-smi"} <= missing
    count = int((inventory.get("gpus") or {}).get("count") or 0)
    if not gpu_tools_missing and count < settings.tensor_parallel_size:
        blockers.append(_blocker("gpus_too_few", node=node, count=count, needed=settings.tensor_parallel_size))
    models = sorted({d.get("model") for d in (inventory.get("gpus") or {}).get("devices") or [] if d.get("model")})
    if len(models) > 1:
        blockers.append(_blocker("gpus_mixed", node=node, models=", ".join(models)))
    return {"ok": not blockers, "blockers": blockers, "findings": findings}


def blocker_text(blocker: dict) -> str:
    """A blocker in the active language."""
    template = MESSAGES.get(blocker.get("code"))
    if not template:
        return str(blocker.get("message", ""))
    params = dict(blocker.get("params") or {})
    if "hint" in params:
        params["hint"] = gettext(params["hint"])
    try:
        return gettext(template) % params
    except (KeyError, TypeError, ValueError):
        return str(blocker.get("message", ""))
