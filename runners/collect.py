"""What comes back from a node: files fetched as artifacts (SHA-256 on the node and here), the files a deployment
recorded, and the checks made once they are kept (LMCache trouble in the server log, the FX path still the one
attached).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from runners import ssh
from runners.artifacts import ArtifactMismatch, EvidenceStoreError
from runners.deployment import DeployError, Deployment, problem
from runners.lmcache import lmcache_trouble, lmcache_trouble_message
from runners.models import Artifact, Job, Node, Step


def recorded_files(conn: ssh.NodeConnection, deployment: Deployment) -> dict[str, str]:
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


def keep_recorded(job: Job, step: Step | None, node: Node, conn: ssh.NodeConnection, deployment: Deployment,
                   outcome: str) -> list[Artifact]:
    """What the node recorded and no step collected yet, kept with the run's outcome (every file tried)."""
    have = set(Artifact.objects.filter(job=job, name__startswith=deployment.name_prefix + "/").values_list("name", flat=True))
    kept, failed = [], []
    for path, name in recorded_files(conn, deployment).items():
        if name in have:
            continue
        if conn.run(f"test -f {ssh.shell_path(path)}", echo=False, check=False, timeout=30).exit_code != 0:
            continue
        try:
            kept.append(conn.download(path, job=job, name=name, kind=_kind(path), step=step, outcome=outcome))
        except ssh.ConnectionLost:
            raise
        except Exception as exc:  # noqa: BLE001
            failed.append(f"{path}: {problem(exc)}")
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
        mapping = recorded_files(conn, deployment)
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
