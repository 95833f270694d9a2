"""The control plane's end of a site agent: a node of an enrolled site is reached through work units.

``runners.ssh.connect(node)`` hands out an ``AgentConnection`` (through ``route``, which RunnersConfig.ready
registers there) when the node's site has an active agent with a registered key (``runners.models.active_agent``). It has NodeConnection's interface and raises the same
exceptions, so the engine, deploy, probe and collection code does not know the difference: each command, file
write, file read or connection becomes an ``AgentCall`` row that the agent takes (runners.agentapi), and the
caller waits on that row:

* not taken within FXPILOT_AGENT_PICKUP_SECONDS → ``Unreachable`` (the agent is away: a network cut, a restart);
* taken, then no sign of life for FXPILOT_AGENT_SILENCE_SECONDS → ``ConnectionLost``;
* a command still going its timeout + the silence allowance after it was taken → ``CommandTimeout``;
* the run canceled (``runners.ssh.interruptible``) → the call is canceled and ``Interrupted`` raised.

Whenever the waiter gives up it marks the call expired (a conditional update), so an answer arriving later is
refused (410) and nothing is collected twice. Like a direct SSH failure, all of these but the interruption are
transient for the engine: detached steps re-attach when the agent is back, synchronous ones retry.
"""
from __future__ import annotations

import base64
import hashlib
import shutil
import time
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

import paramiko
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from infra import wakeup
from runners.agentapi import call_answered, calls_queued, discard_file, flush_output, received_file
from runners.artifacts import EvidenceStoreError, sha256_file
from runners.models import AgentCall, Credential, Job, Node, SiteAgent, Step, active_agent
from runners.output import system_line
from runners.ssh import (
    DEFAULT_TIMEOUTS,
    AuthenticationFailed,
    CommandFailed,
    CommandTimeout,
    ConnectionLost,
    HostKeyChanged,
    HostKeyPending,
    Interrupted,
    InvalidNodeSettings,
    NodeConnection,
    Result,
    SSHError,
    Timeouts,
    TransferMismatch,
    Unreachable,
    _interruption,
    _record_offered_key,
    _short,
    check_node_settings,
    shell_path,
)

MAX_PAYLOAD = 64 * 1024 * 1024  # a put's bytes travel in the row
# A waiter on a call looks at it after 0.05 s, then less often, at least once a second: its answer wakes the wait
# (infra.wakeup), so the looks only keep the deadlines (the pickup, the silence, the command's own).
FIRST_SLEEP, MAX_SLEEP = 0.05, 1.0
OPEN_CALLS = (AgentCall.State.QUEUED, AgentCall.State.TAKEN)


def agent_for(node: Node) -> SiteAgent | None:
    """The agent that reaches `node`, or None when the control plane reaches it itself."""
    return active_agent(node.site_id)


class AgentConnection(NodeConnection):
    """NodeConnection's interface over the site agent. ``open`` asks the agent to connect once (a first contact
    records the offered host key, as over direct SSH); every command or transfer is one call."""

    def __init__(self, node: Node, *, agent: SiteAgent | None = None, timeouts: Timeouts = DEFAULT_TIMEOUTS) -> None:
        super().__init__(node, timeouts=timeouts)
        self.agent = agent
        self._open = False
        self._collecting: tuple[Job | None, Step | None] = (None, None)

    # --- the connection ---

    def __enter__(self) -> AgentConnection:
        return self if self._open else self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def transport(self):
        raise ConnectionLost("a node reached through the site agent has no SSH transport here", node=self.node)

    @property
    def sftp(self):
        raise ConnectionLost("a node reached through the site agent has no SFTP session here", node=self.node)

    def open(self) -> AgentConnection:
        if self._open:
            return self
        self._check_node()
        self._call(AgentCall.Op.CONTACT, {}, what="connecting")
        self._open = True
        return self

    def close(self) -> None:
        self._open = False

    def _check_node(self) -> None:
        """What the control plane can tell before the agent tries: the node's settings and its credential."""
        agent = self._agent()
        for node in (self.node, self.node.jump_host if self.node.jump_host_id else None):
            if node is None:
                continue
            check_node_settings(node)
            credential = Credential.objects.select_related("sealed_to").get(pk=node.credential_id)  # as it is now
            if not credential.sealed_key:
                raise InvalidNodeSettings(f"credential {credential.name} is not sealed to the site agent yet (the "
                                          "agent reseals the site's keys when it says hello)", node=node)
            sealed_to = credential.sealed_to
            if sealed_to is None or sealed_to.public_key != agent.public_key:
                raise InvalidNodeSettings(f"credential {credential.name} is sealed to a previous agent key, which "
                                          f"the site agent ({agent.key_fingerprint}) cannot open; upload the key "
                                          "again", node=node)

    def _agent(self) -> SiteAgent:
        if self.agent is None:
            self.agent = agent_for(self.node)
        if self.agent is None:
            raise Unreachable(f"site {self.node.site.name} has no enrolled site agent any more", node=self.node)
        return self.agent

    # --- calls ---

    def _call(self, op: str, args: dict, *, what: str, job: Job | None = None, step: Step | None = None,
              timeout: float | None = None, payload: bytes | None = None, command: str = "") -> AgentCall:
        """Queue one call and wait for its answer; a failure the agent reports raises its SSHError."""
        why = _interruption()
        if why:
            raise Interrupted(f"{what} not started: {why}", node=self.node)
        pickup = float(settings.FXPILOT_AGENT_PICKUP_SECONDS)
        silence = float(settings.FXPILOT_AGENT_SILENCE_SECONDS)
        # The answer deadline the agent is given (and the API enforces when no waiter is left to): later than the
        # waiter's own limit below, so that a waiter still here is the one that gives up and says why.
        within = (timeout + 2 * silence) if timeout else float(settings.FXPILOT_STEP_DEADLINE_SECONDS)
        call = AgentCall.objects.create(
            site_id=self.node.site_id, node=self.node, job=job, step=step, op=op, payload=payload,
            request={"args": args, "answer_within": within}, deadline=timezone.now() + timedelta(seconds=pickup))
        site = self.node.site_id
        transaction.on_commit(lambda: wakeup.notify(calls_queued(site)))  # the agent's waiting poll takes it now
        started = time.monotonic()
        sleep = FIRST_SLEEP
        while True:
            why = _interruption()
            if why:
                self._give_up(call, AgentCall.State.CANCELED)
                raise Interrupted(f"{what} stopped after {time.monotonic() - started:.0f} s: {why}", node=self.node)
            row = AgentCall.objects.filter(pk=call.pk).values("state", "taken_at", "touched").first()
            if row is None:
                raise ConnectionLost(f"{what}: the site agent's call {call.pk} disappeared", node=self.node)
            state, now = row["state"], timezone.now()
            if state == AgentCall.State.DONE:
                call.refresh_from_db()
                return self._answer(call, what=what, command=command)
            if state in (AgentCall.State.CANCELED, AgentCall.State.EXPIRED):
                if timeout and row["taken_at"] and (now - row["taken_at"]).total_seconds() >= timeout:
                    raise CommandTimeout(f"`{_short(command)}` still running after {timeout:g} s; given up",
                                         node=self.node, result=self._partial(call, command))
                raise ConnectionLost(f"{what}: the site agent's call {call.pk} was {state} before it was answered",
                                     node=self.node, result=self._partial(call, command))
            if state == AgentCall.State.QUEUED and time.monotonic() - started >= pickup:
                if self._give_up(call, AgentCall.State.EXPIRED, state=AgentCall.State.QUEUED):
                    raise Unreachable(f"the site agent of {self.node.site.name} did not take the call within "
                                      f"{pickup:g} s ({self._last_seen()})", node=self.node)
                continue  # taken meanwhile
            if state == AgentCall.State.TAKEN:
                touched = row["touched"] or row["taken_at"]
                if (now - touched).total_seconds() >= silence:
                    if self._give_up(call, AgentCall.State.EXPIRED, state=AgentCall.State.TAKEN):
                        raise ConnectionLost(f"{what}: the site agent took call {call.pk} and then fell silent for "
                                             f"{silence:g} s ({self._last_seen()})", node=self.node,
                                             result=self._partial(call, command))
                    continue
                if timeout and (now - row["taken_at"]).total_seconds() >= timeout + silence:
                    if self._give_up(call, AgentCall.State.EXPIRED, state=AgentCall.State.TAKEN):
                        raise CommandTimeout(f"`{_short(command)}` still running after {timeout:g} s; given up",
                                             node=self.node, result=self._partial(call, command))
                    continue
            # the answer's arrival wakes this wait at once (infra.wakeup); the looks in between see to the deadlines
            wakeup.wait(call_answered(call.pk), sleep)
            sleep = min(sleep * 1.5, MAX_SLEEP)

    def _give_up(self, call: AgentCall, new_state: str, *, state: str | None = None) -> bool:
        """Mark the call canceled or expired if it is still open (in `state`); write what output it left."""
        states = (state,) if state else OPEN_CALLS
        changed = AgentCall.objects.filter(pk=call.pk, state__in=states).update(state=new_state,
                                                                                  finished=timezone.now(), payload=None)
        if changed:
            call.refresh_from_db()
            flush_output(call)
            discard_file(call)
        return bool(changed)

    def _last_seen(self) -> str:
        agent = SiteAgent.objects.filter(pk=self._agent().pk).values("last_seen", "revoked_at").first()
        if agent is None or agent["revoked_at"] is not None:
            return "its credential was revoked"
        if agent["last_seen"] is None:
            return "it was never seen"
        ago = (timezone.now() - agent["last_seen"]).total_seconds()
        return f"last seen {ago:.0f} s ago"

    def _partial(self, call: AgentCall, command: str) -> Result:
        call.refresh_from_db()
        return self._result(call, command, None)

    def _result(self, call: AgentCall, command: str, code: int | None) -> Result:
        end = call.finished or timezone.now()
        truncated = set((call.output_state or {}).get("truncated", []))
        return Result(command, code, call.stdout_tail, call.stderr_tail, (end - call.created).total_seconds(),
                      "stdout" in truncated, "stderr" in truncated)

    def _answer(self, call: AgentCall, *, what: str, command: str) -> AgentCall:
        error = (call.result or {}).get("error")
        if not error:
            return call
        kind, message = error.get("kind"), error.get("message") or "(no reason given)"
        node = self.node
        if error.get("node") and node.jump_host_id and error["node"] == node.jump_host.name:
            node = node.jump_host
        if kind in ("host-key-pending", "host-key-changed"):
            offered = _offered_key(error.get("offered_key"))
            if offered is None:
                raise SSHError(f"{what}: the site agent reported {kind} without the offered key ({message})",
                               node=node)
            _record_offered_key(node, offered)
            if kind == "host-key-changed" or node.host_key_state == Node.HostKeyState.ACCEPTED:
                raise HostKeyChanged(node, node.host_key_fingerprint, offered.fingerprint)
            raise HostKeyPending(node, offered.fingerprint)
        partial = self._result(call, command, None)
        if kind == "unreachable":
            raise Unreachable(message, node=node)
        if kind == "connection-lost":
            raise ConnectionLost(message, node=node, result=partial)
        if kind == "timeout":
            raise CommandTimeout(message, node=node, result=partial)
        if kind == "auth":
            raise AuthenticationFailed(message, node=node)
        if kind == "invalid":
            raise InvalidNodeSettings(message, node=node)
        raise SSHError(f"{what}: {message}", node=node)  # io: a file that cannot be read or written

    # --- commands ---

    def run(self, command: str, *, job: Job | None = None, step: Step | None = None, timeout: float | None = None,
            check: bool = True, echo: bool = True) -> Result:
        """Run a command through the agent, its output streamed into the job; raise as NodeConnection.run does."""
        self._ensure_open()
        if job is not None and echo:
            system_line(job, f"[{self.node.name}] $ {_short(command, 500)}", step=step)
        call = self._call(AgentCall.Op.RUN, {"command": command, "timeout": timeout}, what=f"`{_short(command)}`",
                          job=job, step=step, timeout=timeout, command=command)
        res = self._result(call, command, call.result.get("exit_code"))
        if check and res.exit_code != 0:
            raise CommandFailed(self.node, res)
        return res

    def _ensure_open(self) -> None:
        if not self._open:
            self.open()

    # --- files ---

    def upload(self, source: bytes | str | Path | BinaryIO, remote_path: str, *, mode: int | None = None) -> str:
        """The agent writes ``remote_path.part``, hashes it on the node and renames it; the hashes must match."""
        self._ensure_open()
        shell_path(remote_path)  # validates the path
        if isinstance(source, bytes):
            data = source
        elif isinstance(source, (str, Path)):
            size = Path(source).stat().st_size
            if size > MAX_PAYLOAD:
                raise SSHError(_too_large(remote_path, size), node=self.node)
            data = Path(source).read_bytes()
        else:
            data = source.read(MAX_PAYLOAD + 1)
        if len(data) > MAX_PAYLOAD:
            raise SSHError(_too_large(remote_path, len(data)), node=self.node)
        local = hashlib.sha256(data).hexdigest()
        call = self._call(AgentCall.Op.PUT, {"path": remote_path, "mode": mode, "size": len(data), "sha256": local},
                          what=f"writing {remote_path}", payload=data)
        remote = call.result.get("sha256")
        if remote != local:
            raise TransferMismatch(f"upload of {remote_path} corrupted: sent SHA-256 {local}, the node has {remote}",
                                   node=self.node)
        return local

    def fetch_to(self, remote_path: str, local_path: Path | str, *, remote_sha256: str | None = None) -> str:
        """Copy a remote file to a local path through the agent, hashed on the node, on arrival and here."""
        self._ensure_open()
        remote = remote_sha256 or self.remote_sha256(remote_path)
        job, step = self._collecting
        call = self._call(AgentCall.Op.GET, {"path": remote_path}, what=f"reading {remote_path}", job=job, step=step)
        received = received_file(call)
        if received is None or not received.exists():
            raise ConnectionLost(f"the site agent reported {remote_path} read, but its bytes did not arrive",
                                 node=self.node)
        try:
            try:
                shutil.move(received, local_path)
            except OSError as exc:
                raise EvidenceStoreError(f"cannot write the download of {remote_path} from node {self.node.name} to "
                                         f"{Path(local_path).parent} ({exc.strerror or exc}): nothing of it was "
                                         "stored") from None
        finally:
            discard_file(call)
        local = sha256_file(local_path)
        if local != remote or call.result.get("sha256") != remote:
            raise TransferMismatch(f"download of {remote_path} corrupted: the node computed SHA-256 {remote}, "
                                   f"the bytes received hash to {local}", node=self.node)
        return local

    def download(self, remote_path: str, *, job: Job, name: str, kind: str, step: Step | None = None,
                 outcome: str = ""):
        """NodeConnection's (the node's hash, then fetch_to, then the evidence store); the get call names the job
        and step it collects for. remote_sha256 and mkdirs are NodeConnection's too: they go through run."""
        self._collecting = (job, step)
        try:
            return super().download(remote_path, job=job, name=name, kind=kind, step=step, outcome=outcome)
        finally:
            self._collecting = (None, None)


def _too_large(remote_path: str, size: int) -> str:
    return (f"cannot write {remote_path} through the site agent: {size} bytes, and a file sent to a node through "
            f"the agent may have at most {MAX_PAYLOAD // 2**20} MiB")


def _offered_key(text) -> paramiko.PKey | None:
    if not isinstance(text, str) or " " not in text:
        return None
    kind, _, blob = text.strip().partition(" ")
    try:
        return paramiko.PKey.from_type_string(kind, base64.b64decode(blob.split()[0]))
    except (ValueError, paramiko.SSHException, TypeError, IndexError):
        return None


def route(node: Node, *, timeouts: Timeouts = DEFAULT_TIMEOUTS) -> AgentConnection | None:
    """runners.ssh.connect's route (registered by RunnersConfig.ready): a connection through the site's agent, not
    yet open, when the node's site has one; None when the control plane reaches the node itself."""
    agent = agent_for(node)
    return AgentConnection(node, agent=agent, timeouts=timeouts) if agent is not None else None
