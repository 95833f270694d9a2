"""The SSH layer: pinned host keys, keys from the credential store, streamed output, checked transfers.

Errors are classified for the orchestrator: ``exc.transient`` is True when a retry may succeed
(connection refused/reset/timed out, connection lost, transfer corrupted) and False when a person
must act (authentication refused, host key unknown or changed, bad node settings, command failed).
"""
from __future__ import annotations

import base64
import codecs
import contextlib
import hashlib
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import paramiko
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from runners import sshparts
from runners.artifacts import ArtifactMismatch, EvidenceStoreError, sha256_file, store_file
from runners.credentials import credential_pkey
from runners.crypto import DecryptionError
from runners.models import Artifact, Job, Node, OutputChunk, Step
from runners.output import append_output, system_line
from runners.validators import validate_host, validate_port, validate_remote_path, validate_username

TAIL_BYTES = 1 << 20


Timeouts, DEFAULT_TIMEOUTS = sshparts.Timeouts, sshparts.DEFAULT_TIMEOUTS


class SSHError(Exception):
    """Something between fxpilot and a node broke; ``transient`` says whether a retry may help."""

    transient = False

    def __init__(self, message: str, *, node: Node | None = None) -> None:
        self.node = node
        super().__init__(f"{_where(node)}: {message}" if node is not None else message)


class Unreachable(SSHError):
    transient = True


class ConnectionLost(SSHError):
    """The connection dropped during a command; ``result`` holds the output received until then."""

    transient = True

    def __init__(self, message: str, *, node: Node | None = None, result: Result | None = None) -> None:
        self.result = result
        super().__init__(message, node=node)


class CommandTimeout(ConnectionLost):
    """The command ran past its time limit; the channel was closed, ``result`` holds the output so far."""


class AuthenticationFailed(SSHError):
    pass


class Interrupted(SSHError):
    """A command was stopped on our side because its step's run was canceled (see ``interruptible``)."""


class InvalidNodeSettings(SSHError):
    pass


class HostKeyPending(SSHError):
    """First contact: the offered key is recorded and waits for an engineer to accept it."""

    def __init__(self, node: Node, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        super().__init__(f"host key {fingerprint} is not accepted yet; check it with the node's administrator and "
                         f"accept it (manage.py accept_host_key) before running anything here", node=node)


class HostKeyChanged(SSHError):
    """The node offered another key than the accepted one: possibly a man in the middle."""

    def __init__(self, node: Node, expected: str, offered: str) -> None:
        self.expected, self.offered = expected, offered
        super().__init__(f"HOST KEY CHANGED: accepted {expected}, offered {offered}. Nothing was sent. If the node "
                         f"was reinstalled, verify the new key and accept it; otherwise treat this as an attack",
                         node=node)


class CommandFailed(SSHError):
    def __init__(self, node: Node, result: Result) -> None:
        self.result, self.exit_code, self.stderr_tail = result, result.exit_code, result.stderr_tail
        last = result.stderr_tail.strip().splitlines()[-5:]
        detail = (": " + " | ".join(last)) if last else ""
        super().__init__(f"`{_short(result.command)}` exited with code {result.exit_code}{detail}", node=node)


class TransferMismatch(SSHError, ArtifactMismatch):
    """The bytes on both ends hash differently: the transfer is not trusted (retrying may help)."""

    transient = True


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, SSHError) and exc.transient


# Thread → (event, why): while the event is set, the next command of that thread is interrupted, once.
_INTERRUPTS: dict[int, tuple[threading.Event, str]] = {}


@contextlib.contextmanager
def interruptible(event: threading.Event, why: str):
    """Within the block, a command this thread runs stops (Interrupted) as soon as `event` is set.

    The interruption is delivered once: what the handler does after it — a deploy tearing down what it
    started — runs its commands to the end. The remote command itself is not signalled (closing the channel
    does not kill it); the caller's cleanup stops what must not stay.
    """
    ident = threading.get_ident()
    _INTERRUPTS[ident] = (event, why)
    try:
        yield
    finally:
        _INTERRUPTS.pop(ident, None)


def _interruption() -> str | None:
    ident = threading.get_ident()
    entry = _INTERRUPTS.get(ident)
    if entry is None or not entry[0].is_set():
        return None
    _INTERRUPTS.pop(ident, None)
    return entry[1]


@dataclass
class Result:
    command: str
    exit_code: int | None
    stdout_tail: str
    stderr_tail: str
    duration: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def stdout(self) -> str:
        return self.stdout_tail

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def _where(node: Node | None) -> str:
    return f"node {node.name} ({node.username}@{node.host}:{node.port})" if node is not None else "node"


def _short(command: str, limit: int = 120) -> str:
    return command if len(command) <= limit else command[: limit - 1] + "…"


def known_hosts_name(node: Node) -> str:
    return node.host if node.port == 22 else f"[{node.host}]:{node.port}"


def shell_path(path: str) -> str:
    """A remote path quoted for the shell; a leading ``~/`` stays the remote user's home."""
    validate_remote_path(path)
    return sshparts.shell_quoted(path)


def sftp_path(path: str) -> str:
    """SFTP has no ``~``: paths relative to the login directory (the home) are used instead."""
    validate_remote_path(path)
    return sshparts.sftp_named(path)


# --- host keys ---------------------------------------------------------------------------------

def _record_offered_key(node: Node, key: paramiko.PKey) -> None:
    fields = {"pending_host_key_type": key.get_name(), "pending_host_key": key.get_base64(),
              "pending_host_key_fingerprint": key.fingerprint}
    if node.host_key_state != Node.HostKeyState.ACCEPTED:
        fields["host_key_state"] = Node.HostKeyState.PENDING
    Node.objects.filter(pk=node.pk).update(**fields)
    for name, value in fields.items():
        setattr(node, name, value)


class _PinnedKeyPolicy(paramiko.RejectPolicy):
    """RejectPolicy that first writes down the key it rejects, so an engineer can compare and accept it."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def missing_host_key(self, client, hostname, key) -> None:
        _record_offered_key(self.node, key)
        if self.node.host_key_state == Node.HostKeyState.ACCEPTED:
            raise HostKeyChanged(self.node, self.node.host_key_fingerprint, key.fingerprint)
        raise HostKeyPending(self.node, key.fingerprint)


def accepted_host_key(node: Node) -> paramiko.PKey | None:
    if node.host_key_state != Node.HostKeyState.ACCEPTED or not node.host_key:
        return None
    return paramiko.PKey.from_type_string(node.host_key_type, base64.b64decode(node.host_key))


def accept_host_key(node: Node, fingerprint: str, *, user=None, label: str = "") -> Node:
    """Accept the pending key whose fingerprint the engineer confirmed (out of band) — and only that one."""
    if not node.pending_host_key:
        raise ValueError(_("%(node)s: no host key is waiting; connect once (e.g. run a probe) to record it")
                         % {"node": _where(node)})
    if fingerprint != node.pending_host_key_fingerprint:
        raise ValueError(_("%(node)s: the waiting key is %(waiting)s, not %(given)s")
                         % {"node": _where(node), "waiting": node.pending_host_key_fingerprint, "given": fingerprint})
    with transaction.atomic():
        done = Node.objects.filter(pk=node.pk, pending_host_key_fingerprint=fingerprint).update(
            host_key_state=Node.HostKeyState.ACCEPTED, host_key_type=node.pending_host_key_type,
            host_key=node.pending_host_key, host_key_fingerprint=fingerprint, pending_host_key_type="",
            pending_host_key="", pending_host_key_fingerprint="", host_key_accepted_by=user,
            host_key_accepted_label="" if user is not None else label[:150], host_key_accepted_at=timezone.now())
    if not done:
        raise ValueError(_("%(node)s: the waiting host key changed meanwhile; look again") % {"node": _where(node)})
    node.refresh_from_db()
    return node


# --- connections -------------------------------------------------------------------------------

def check_node_settings(node: Node) -> None:
    """What must hold before anything contacts a node, directly or through its site's agent: a valid address and
    user name, and a credential. InvalidNodeSettings names what is wrong."""
    try:
        validate_host(node.host)
        validate_port(node.port)
        validate_username(node.username)
    except ValidationError as exc:
        raise InvalidNodeSettings("; ".join(exc.messages), node=node) from None
    if node.credential_id is None:
        raise InvalidNodeSettings("no credential is assigned", node=node)


class NodeConnection:
    """One SSH connection to a node (through its jump host if it has one). Use as a context manager."""

    def __init__(self, node: Node, *, timeouts: Timeouts = DEFAULT_TIMEOUTS) -> None:
        self.node = node
        self.timeouts = timeouts
        self._client: paramiko.SSHClient | None = None
        self._jump: NodeConnection | None = None
        self._sftp: paramiko.SFTPClient | None = None

    def __enter__(self) -> NodeConnection:
        # `with connect(node) as conn` hands over a connection already open: opening it again would leave the
        # first session connected (idle, for the life of the worker).
        return self if self._client is not None else self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def transport(self) -> paramiko.Transport:
        if self._client is None or self._client.get_transport() is None:
            raise ConnectionLost("not connected", node=self.node)
        return self._client.get_transport()

    def open(self) -> NodeConnection:
        if self._client is not None:
            return self
        node = self.node
        check_node_settings(node)
        try:
            pkey = credential_pkey(node.credential)
        except (ValidationError, DecryptionError) as exc:
            raise InvalidNodeSettings(f"credential {node.credential.name} cannot be used: {exc}", node=node) from None
        sock = self._through_jump_host() if node.jump_host_id else None
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_PinnedKeyPolicy(node))
        pinned = accepted_host_key(node)
        if pinned is not None:
            client.get_host_keys().add(known_hosts_name(node), pinned.get_name(), pinned)
        t = self.timeouts
        try:
            client.connect(node.host, port=node.port, username=node.username, pkey=pkey, sock=sock,
                           timeout=t.connect, banner_timeout=t.banner, auth_timeout=t.auth, channel_timeout=t.channel,
                           look_for_keys=False, allow_agent=False)
        except (HostKeyPending, HostKeyChanged):
            self._abort(client)
            raise
        except paramiko.BadHostKeyException as exc:
            self._abort(client)
            _record_offered_key(node, exc.key)
            raise HostKeyChanged(node, node.host_key_fingerprint, exc.key.fingerprint) from None
        except paramiko.AuthenticationException as exc:
            self._abort(client)
            raise AuthenticationFailed(f"authentication refused for user {node.username} with key "
                                       f"{node.credential.public_fingerprint} ({exc})", node=node) from None
        except socket.gaierror as exc:
            self._abort(client)
            if exc.errno == socket.EAI_AGAIN:
                raise Unreachable(f"name lookup of {node.host} failed for now ({exc.strerror})", node=node) from None
            raise InvalidNodeSettings(f"cannot resolve host name {node.host} ({exc.strerror})", node=node) from None
        except TimeoutError:
            self._abort(client)
            raise Unreachable(f"no answer within {t.connect:g} s (timed out)", node=node) from None
        except (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError, OSError) as exc:
            self._abort(client)
            raise Unreachable(f"cannot connect ({exc})", node=node) from None
        except (paramiko.SSHException, EOFError) as exc:
            self._abort(client)
            raise Unreachable(f"SSH handshake failed ({exc or type(exc).__name__})", node=node) from None
        client.get_transport().set_keepalive(t.keepalive)
        self._client = client
        return self

    def _through_jump_host(self) -> paramiko.Channel:
        self._jump = NodeConnection(self.node.jump_host, timeouts=self.timeouts).open()
        try:
            return self._jump.transport.open_channel("direct-tcpip", (self.node.host, self.node.port), ("127.0.0.1", 0),
                                                     timeout=self.timeouts.connect)
        except (paramiko.ChannelException, paramiko.SSHException, EOFError, OSError) as exc:
            self._jump.close()
            raise Unreachable(f"jump host {self.node.jump_host.name} cannot reach {self.node.host}:{self.node.port} "
                              f"({exc})", node=self.node) from None

    def _abort(self, client: paramiko.SSHClient) -> None:
        client.close()
        if self._jump is not None:
            self._jump.close()
            self._jump = None

    def close(self) -> None:
        for closer in (self._sftp, self._client, self._jump):
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # noqa: BLE001 — closing a dead connection must never mask the real error
                    pass
        self._sftp = self._client = self._jump = None

    # --- commands ---

    def run(self, command: str, *, job: Job | None = None, step: Step | None = None, timeout: float | None = None,
            check: bool = True, echo: bool = True) -> Result:
        """Run a command, streaming its output into the job as it comes; raise on failure (see the module doc)."""
        if job is not None and echo:
            system_line(job, f"[{self.node.name}] $ {_short(command, 500)}", step=step)
        started = time.monotonic()
        out, err = _Tail(), _Tail()
        sink = _OutputSink(job, step)
        transport = self.transport
        why = _interruption()
        if why:
            raise Interrupted(f"`{_short(command)}` not run: {why}", node=self.node)

        def result(code: int | None) -> Result:
            return Result(command, code, out.text(), err.text(), time.monotonic() - started, out.truncated, err.truncated)

        try:
            chan = transport.open_session(timeout=self.timeouts.channel)
            chan.exec_command(command)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise ConnectionLost(f"cannot open a session ({exc or type(exc).__name__})", node=self.node,
                                 result=result(None)) from None
        deadline = started + timeout if timeout else None
        try:
            while True:
                busy = False
                while chan.recv_ready():
                    data = chan.recv(32768)
                    out.add(data)
                    sink.add(OutputChunk.Stream.STDOUT, data)
                    busy = True
                while chan.recv_stderr_ready():
                    data = chan.recv_stderr(32768)
                    err.add(data)
                    sink.add(OutputChunk.Stream.STDERR, data)
                    busy = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if not transport.is_active():
                    raise ConnectionLost(f"connection lost during `{_short(command)}`", node=self.node, result=result(None))
                if deadline is not None and time.monotonic() > deadline:
                    chan.close()
                    raise CommandTimeout(f"`{_short(command)}` still running after {timeout:g} s; channel closed",
                                         node=self.node, result=result(None))
                why = _interruption()
                if why:
                    chan.close()
                    raise Interrupted(f"`{_short(command)}` stopped after {time.monotonic() - started:.0f} s: {why}",
                                      node=self.node)
                sink.flush(final=False)
                if not busy:
                    time.sleep(0.02)
        except (EOFError, OSError, paramiko.SSHException) as exc:
            raise ConnectionLost(f"connection lost during `{_short(command)}` ({exc or type(exc).__name__})",
                                 node=self.node, result=result(None)) from None
        finally:
            sink.flush(final=True)
        code = chan.exit_status
        status_received = chan.status_event.is_set() and code != -1
        chan.close()
        if not status_received:
            raise ConnectionLost(f"connection lost during `{_short(command)}` (no exit status)", node=self.node,
                                 result=result(None))
        res = result(code)
        if check and code != 0:
            raise CommandFailed(self.node, res)
        return res

    # --- files ---

    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            try:
                self._sftp = self._client.open_sftp() if self._client else None
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise ConnectionLost(f"cannot open SFTP ({exc})", node=self.node) from None
            if self._sftp is None:
                raise ConnectionLost("not connected", node=self.node)
            self._sftp.get_channel().settimeout(max(self.timeouts.channel, 60.0))
        return self._sftp

    def remote_sha256(self, path: str) -> str:
        res = self.run(f"sha256sum -- {shell_path(path)}", echo=False, timeout=600)
        digest = res.stdout_tail.split(" ", 1)[0].lstrip("\\").strip()
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise SSHError(f"sha256sum printed no hash for {path}: {res.stdout_tail[:200]!r}", node=self.node)
        return digest

    def mkdirs(self, *paths: str) -> None:
        """Make the folders (and their parents) in one command: one round trip, through a site agent too."""
        if paths:
            self.run("mkdir -p -- " + " ".join(shell_path(path) for path in paths), echo=False, timeout=60)

    def upload(self, source: bytes | str | Path | BinaryIO, remote_path: str, *, mode: int | None = None) -> str:
        """Write to ``remote_path.part``, compare SHA-256 on both ends, then rename; returns the hash."""
        part = remote_path + ".part"
        if isinstance(source, bytes):
            local = hashlib.sha256(source).hexdigest()
            self._put(_BytesReader(source), part)
        elif isinstance(source, (str, Path)):
            local = sha256_file(source)
            with open(source, "rb") as handle:
                self._put(handle, part)
        else:
            data = source.read()
            local = hashlib.sha256(data).hexdigest()
            self._put(_BytesReader(data), part)
        remote = self.remote_sha256(part)
        if remote != local:
            self._quiet_remove(part)
            raise TransferMismatch(f"upload of {remote_path} corrupted: sent SHA-256 {local}, the node has {remote}",
                                   node=self.node)
        try:
            if mode is not None:
                self.sftp.chmod(sftp_path(part), mode)
            self.sftp.posix_rename(sftp_path(part), sftp_path(remote_path))
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise SSHError(f"cannot finish the upload of {remote_path} ({exc})", node=self.node) from None
        return local

    def _put(self, handle, part: str) -> None:
        try:
            self.sftp.putfo(handle, sftp_path(part), confirm=True)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if not self.transport.is_active():
                raise ConnectionLost(f"connection lost while uploading {part}", node=self.node) from None
            raise SSHError(f"cannot write {part} ({exc})", node=self.node) from None

    def _quiet_remove(self, path: str) -> None:
        try:
            self.sftp.remove(sftp_path(path))
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def download(self, remote_path: str, *, job: Job, name: str, kind: str, step: Step | None = None,
                 outcome: str = "") -> Artifact:
        """Fetch a file into the artifact store, hashed on the node, here, and on its way into the store."""
        return self._fetch(remote_path, self.remote_sha256(remote_path), job=job, name=name, kind=kind, step=step,
                           outcome=outcome)

    def fetch_to(self, remote_path: str, local_path: Path | str, *, remote_sha256: str | None = None) -> str:
        """Copy a remote file to a local path, hashed on the node and again here; returns the SHA-256."""
        remote = remote_sha256 or self.remote_sha256(remote_path)
        with open(local_path, "wb") as handle:
            try:
                local = _LocalFile(handle, local_path)
                self.sftp.getfo(sftp_path(remote_path), local)
                local.flush()
            except _LocalWriteFailed as exc:
                raise EvidenceStoreError(f"cannot write the download of {remote_path} from node {self.node.name} to "
                                         f"{Path(local_path).parent} ({exc.cause.strerror or exc.cause}): "
                                         "nothing of it was stored") from None
            except (OSError, EOFError, paramiko.SSHException) as exc:
                if not self.transport.is_active():
                    raise ConnectionLost(f"connection lost while downloading {remote_path}", node=self.node) from None
                raise SSHError(f"cannot read {remote_path} ({exc})", node=self.node) from None
        local = sha256_file(local_path)
        if local != remote:
            raise TransferMismatch(f"download of {remote_path} corrupted: the node computed SHA-256 {remote}, "
                                   f"the bytes received hash to {local}", node=self.node)
        return local

    def _fetch(self, remote_path: str, remote: str, *, job: Job, name: str, kind: str, step: Step | None,
               outcome: str = "") -> Artifact:
        tmp_dir = Path(settings.DATA_DIR) / "tmp"
        tmp_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=tmp_dir, prefix="download-") as tmp:
            self.fetch_to(remote_path, tmp.name, remote_sha256=remote)
            return store_file(job, name, tmp.name, kind=kind, step=step, node=self.node, simulated=self.node.simulated,
                              remote_sha256=remote, outcome=outcome)


# How a node is reached when not by SSH from this process: a route answers a connection (not yet open) for the
# node, or None. runners.agentlink's (registered by RunnersConfig.ready) takes the nodes of a site with an
# enrolled agent; without a route, or when none answers, the node is reached directly.
_ROUTES: list[Callable[..., NodeConnection | None]] = []


def add_route(route: Callable[..., NodeConnection | None]) -> None:
    if route not in _ROUTES:
        _ROUTES.append(route)


def connect(node: Node, *, timeouts: Timeouts = DEFAULT_TIMEOUTS) -> NodeConnection:
    """An open connection to `node`: through its site's agent when the site has one enrolled (runners.agentlink:
    the same interface and exceptions), else SSH from this process."""
    for route in _ROUTES:
        conn = route(node, timeouts=timeouts)
        if conn is not None:
            return conn.open()
    return NodeConnection(node, timeouts=timeouts).open()


def run(node: Node, command: str, *, job: Job | None = None, step: Step | None = None, timeout: float | None = None,
        check: bool = True, timeouts: Timeouts = DEFAULT_TIMEOUTS) -> Result:
    """One command on one node over a fresh connection (see NodeConnection.run)."""
    with connect(node, timeouts=timeouts) as conn:
        return conn.run(command, job=job, step=step, timeout=timeout, check=check)


def upload(node: Node, source: bytes | str | Path, remote_path: str, *, mode: int | None = None,
           timeouts: Timeouts = DEFAULT_TIMEOUTS) -> str:
    with connect(node, timeouts=timeouts) as conn:
        return conn.upload(source, remote_path, mode=mode)


def download(node: Node, remote_path: str, *, job: Job, name: str, kind: str, step: Step | None = None,
             timeouts: Timeouts = DEFAULT_TIMEOUTS) -> Artifact:
    with connect(node, timeouts=timeouts) as conn:
        return conn.download(remote_path, job=job, name=name, kind=kind, step=step)


# --- output helpers -----------------------------------------------------------------------------

class _LocalWriteFailed(Exception):
    def __init__(self, cause: OSError) -> None:
        self.cause = cause
        super().__init__(str(cause))


class _LocalFile:
    """The local end of a download: its write errors (a full disk) are told apart from the node's read errors."""

    def __init__(self, handle: BinaryIO, path: Path | str) -> None:
        self._handle, self.path = handle, path

    def write(self, data: bytes) -> int:
        try:
            return self._handle.write(data)
        except OSError as exc:
            raise _LocalWriteFailed(exc) from exc

    def flush(self) -> None:
        try:
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            raise _LocalWriteFailed(exc) from exc

    def __getattr__(self, name):
        return getattr(self._handle, name)


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self._data, self._pos = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._pos + size
        chunk = self._data[self._pos:end]
        self._pos += len(chunk)
        return chunk


class _Tail:
    """The last TAIL_BYTES of a stream."""

    def __init__(self, cap: int = TAIL_BYTES) -> None:
        self.cap, self.buf, self.truncated = cap, bytearray(), False

    def add(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > self.cap:
            del self.buf[: len(self.buf) - self.cap]
            self.truncated = True

    def text(self) -> str:
        return self.buf.decode("utf-8", errors="replace")


@dataclass
class _OutputSink:
    """Line-chunked streaming into the job: whole lines, flushed every ~0.2 s or 8 KiB."""

    job: Job | None
    step: Step | None
    interval: float = 0.2
    size: int = 8192
    pending: dict = field(default_factory=dict)
    decoders: dict = field(default_factory=dict)
    last_flush: float = field(default_factory=time.monotonic)

    def add(self, stream: str, data: bytes) -> None:
        if self.job is None:
            return
        decoder = self.decoders.setdefault(stream, codecs.getincrementaldecoder("utf-8")(errors="replace"))
        self.pending[stream] = self.pending.get(stream, "") + decoder.decode(data)

    def flush(self, *, final: bool) -> None:
        if self.job is None:
            return
        due = final or time.monotonic() - self.last_flush >= self.interval or \
            any(len(text) >= self.size for text in self.pending.values())
        if not due:
            return
        for stream, text in list(self.pending.items()):
            if final:
                text += self.decoders[stream].decode(b"", final=True)
                cut = len(text)
            else:
                cut = text.rfind("\n") + 1
                if cut == 0 and len(text) >= 8 * self.size:
                    cut = len(text)
            if cut:
                append_output(self.job, text[:cut], stream=stream, step=self.step)
                self.pending[stream] = text[cut:]
        self.last_flush = time.monotonic()
