"""Tearing an arm down: stop the server, keep its logs and what the node recorded, detach FX, clean the cache;
every part runs whatever happened to the parts before it, and the error names every failure.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runners import detached, ssh
from runners.collect import keep_recorded
from runners.deployment import (
    DeployError,
    Deployment,
    problem,
    run_outcome,
    run_script,
    save_deployment,
    say,
    server_log_paths,
)
from runners.models import Artifact, Job, Node, Step, describe_holder, lease_holder


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
            self.problems.append(f"{what}: {problem(exc)}")
            self.transient &= ssh.is_transient(exc) or (
                isinstance(exc, DeployError) and isinstance(exc.__cause__, ssh.SSHError) and exc.__cause__.transient)
            if isinstance(exc, ssh.ConnectionLost):
                self.conn.close()
                self.conn = None
            return None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


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
                             lambda conn: keep_recorded(job, step, node, conn, deployment, outcome))
            if kept:
                say(job, step, node, f"{deployment.arm}: kept {len(kept)} file(s) the node recorded before the run "
                                      f"ended ({outcome}): {', '.join(a.name for a in kept)}")
        if deployment.fx_user:
            holder = lease_holder(node)
            if holder is not None and holder.pk != job.pk:
                say(job, step, node, f"{deployment.arm}: the FX array is left attached: node {node.name} is now held "
                                      f"by {describe_holder(holder, job)}")
            else:
                parts.run("detaching the FX array", lambda conn: run_script(
                    conn, job, step, node, deployment, "attach_fx.sh", "detach", f"{deployment.run_dir}/fx.env",
                    deployment.fx_user, what="detaching the FX array"))
        if purge_cache and deployment.arm_dir:
            parts.run("cleaning the cache", lambda conn: run_script(conn, job, step, node, deployment, "deploy.sh", "cleanup",
                                                                 deployment.arm_dir, what="cache cleanup"))
    finally:
        parts.close()
    deployment.torn_down = not parts.problems
    try:
        save_deployment(step, deployment)
    except Exception as exc:  # noqa: BLE001
        parts.problems.append(f"recording the teardown: {problem(exc)}")
    if parts.problems:
        message = (f"{deployment.arm}: teardown incomplete ({len(parts.problems)} part(s) failed): "
                   + "; ".join(parts.problems))
        if parts.transient:
            # Only the node being away stopped it (an SSH outage): the orchestrator runs the teardown again later.
            raise ssh.ConnectionLost(message, node=node)
        raise DeployError(f"node {node.name}: {message}", deployment=deployment)
    say(job, step, node, f"{deployment.arm}: torn down")
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
            failed.append(f"keeping the server log {path}: {problem(exc)}")
    if failed:
        if problems is not None:
            problems.extend(failed)
        else:
            raise DeployError("; ".join(failed), deployment=deployment)
    return kept
