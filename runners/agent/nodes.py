"""SSH to the site's nodes, as a call's node spec says: host key pinned, key sealed to this agent, jump host if any.

The classification of failures mirrors runners.ssh.NodeConnection.open (which the control plane uses for sites
without an agent), as the error kinds of the agent API (docs/site-agent.md, "The protocol"):

    unreachable       refused, reset, timed out, no route, name lookup failing for now, SSH handshake failed
    connection-lost   the connection went away while in use (or could not open a session)
    timeout           the command ran past its timeout; its channel was closed
    auth              the node refused the key
    host-key-pending  the spec pins no host key: the offered one is reported, never accepted
    host-key-changed  the node offered another key than the pinned one
    invalid           the spec cannot be used (bad host, port, user, a key this agent cannot open or parse)
    io                a file could not be written or read on the node, or its hash is not the expected one

Connections are cached per node spec (host key and sealed key included) and closed after 60 s unused; a cached
connection found dead is replaced once before connection-lost is reported.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import paramiko
from cryptography.hazmat.primitives import serialization

from runners import sealing, sshparts
from runners.agent.policy import AddressPolicy, Refused, connect

KINDS = ("unreachable", "connection-lost", "timeout", "auth", "host-key-pending", "host-key-changed", "invalid", "io")
MAX_KEY_BYTES = 64 * 1024
CHUNK = 32768
_USERNAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_HASH = re.compile(r"[0-9a-f]{64}")


class AgentError(Exception):
    """A call's failure, as the agent API reports it: ``{"kind", "message", "offered_key"?}``."""

    def __init__(self, kind: str, message: str, *, offered_key: str | None = None, node: str | None = None,
                 before_start: bool = False) -> None:
        assert kind in KINDS, kind
        self.kind = kind
        self.offered_key = offered_key
        self.node = node
        self.before_start = before_start  # nothing was done on the node yet: a fresh connection may retry it
        super().__init__(message)

    def report(self) -> dict:
        error = {"kind": self.kind, "message": str(self)}
        if self.offered_key:
            error["offered_key"] = self.offered_key
        if self.node:
            error["node"] = self.node
        return {"error": error}


class Stopped(Exception):
    """The control plane asked to stop the command (``{"cancel": true}`` or 410); its channel was closed."""


Timeouts, DEFAULT_TIMEOUTS = sshparts.Timeouts, sshparts.DEFAULT_TIMEOUTS


# --- the node spec ----------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeSpec:
    name: str
    host: str
    port: int
    username: str
    host_key: str | None = None  # "<type> <base64>", or None: not accepted yet
    sealed_key: str = field(default="", repr=False)
    sealed_passphrase: str = field(default="", repr=False)
    jump: NodeSpec | None = None

    @classmethod
    def parse(cls, data, *, depth: int = 0) -> NodeSpec:
        if not isinstance(data, dict):
            raise AgentError("invalid", "the call's node is not an object")
        name = str(data.get("name") or data.get("host") or "?")
        if depth > 4:
            raise AgentError("invalid", f"node {name}: jump hosts nested more than 4 deep")
        host = str(data.get("host") or "").strip()
        if not host or len(host) > 253 or any(c.isspace() or c in "\x00/@" for c in host):
            raise AgentError("invalid", f"node {name}: {host!r} is neither an IP address nor a host name")
        try:
            port = int(data.get("port") or 22)
        except (TypeError, ValueError):
            raise AgentError("invalid", f"node {name}: port {data.get('port')!r} is not a number") from None
        if not 1 <= port <= 65535:
            raise AgentError("invalid", f"node {name}: port {port} is out of range")
        username = str(data.get("username") or "")
        if not _USERNAME.match(username):
            raise AgentError("invalid", f"node {name}: {username!r} is not a valid user name")
        host_key = data.get("host_key") or None
        if host_key is not None:
            host_key = str(host_key).strip()
            _pinned_key(host_key, name)
        jump = data.get("jump")
        return cls(name=name, host=host, port=port, username=username, host_key=host_key,
                   sealed_key=str(data.get("sealed_key") or ""), sealed_passphrase=str(data.get("sealed_passphrase") or ""),
                   jump=cls.parse(jump, depth=depth + 1) if jump else None)

    @property
    def cache_key(self) -> str:
        """Everything that makes one connection differ from another (so a new key or host key gets a new one)."""
        return json.dumps(self._as_dict(), sort_keys=True)

    def _as_dict(self) -> dict:
        return {"host": self.host, "port": self.port, "username": self.username, "host_key": self.host_key,
                "sealed_key": self.sealed_key, "sealed_passphrase": self.sealed_passphrase,
                "jump": self.jump._as_dict() if self.jump else None}

    @property
    def known_hosts_name(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


def _pinned_key(text: str, name: str) -> paramiko.PKey:
    parts = text.split()
    try:
        if len(parts) < 2:
            raise ValueError("not '<type> <base64>'")
        return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1], validate=True))
    except (ValueError, TypeError, paramiko.SSHException) as exc:
        raise AgentError("invalid", f"node {name}: the pinned host key cannot be read ({exc})") from None


def key_text(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


# --- private keys (what runners.credentials.load_private_key does, without Django) -----------

def load_private_key(data: bytes, passphrase: str = "") -> paramiko.PKey:
    """An RSA, ECDSA or Ed25519 private key (OpenSSH or PEM) as a paramiko key; ValueError says why not."""
    if len(data) > MAX_KEY_BYTES:
        raise ValueError("too large to be an SSH private key")
    if b"PRIVATE KEY" not in data:
        raise ValueError("not a private key in OpenSSH or PEM format")
    if b"BEGIN DSA PRIVATE KEY" in data:
        raise ValueError("DSA keys are not supported")
    password = passphrase.encode() if passphrase else None
    try:
        try:
            loaded = serialization.load_ssh_private_key(data, password=password)
        except ValueError:
            if b"OPENSSH PRIVATE KEY" in data:
                raise
            loaded = serialization.load_pem_private_key(data, password=password)
    except TypeError:
        if passphrase:
            raise ValueError("the key is not encrypted but a passphrase was given") from None
        raise ValueError("the key is encrypted and no passphrase was given") from None
    except ValueError as exc:
        text = str(exc).lower()
        if passphrase and ("decrypt" in text or "password" in text or "checksum" in text):
            raise ValueError("the passphrase does not open the key") from None
        raise ValueError("not a private key in OpenSSH or PEM format") from None
    try:
        return sshparts.paramiko_key(loaded)
    except sshparts.UnsupportedKey as exc:
        raise ValueError(f"unsupported key type {exc}") from None
    except ValueError:
        raise ValueError("not a private key in OpenSSH or PEM format") from None


def open_key(spec: NodeSpec, agent_key: str) -> paramiko.PKey:
    if not spec.sealed_key:
        raise AgentError("invalid", f"node {spec.name}: the call carries no key sealed to this agent")
    try:
        data = sealing.open_sealed(agent_key, spec.sealed_key)
        passphrase = sealing.open_sealed(agent_key, spec.sealed_passphrase).decode() if spec.sealed_passphrase else ""
    except (sealing.SealError, UnicodeDecodeError) as exc:
        raise AgentError("invalid", f"node {spec.name}: this agent cannot open the node's key ({exc}); was the "
                                    "site's key sealed to another agent?") from None
    try:
        return load_private_key(data, passphrase)
    except ValueError as exc:
        raise AgentError("invalid", f"node {spec.name}: the node's key cannot be used ({exc})") from None


# --- remote paths -----------------------------------------------------------------------------

def _check_path(path: str) -> str:
    if not isinstance(path, str) or not path or len(path) > 4096 or any(c in path for c in "\x00\n\r"):
        raise AgentError("invalid", f"the remote path {path!r} is empty, too long or holds a NUL or line break")
    return path


def shell_path(path: str) -> str:
    """Quoted for the shell; a leading ``~/`` stays the remote user's home (as runners.ssh.shell_path)."""
    return sshparts.shell_quoted(_check_path(path))


def sftp_path(path: str) -> str:
    return sshparts.sftp_named(_check_path(path))


# --- one connection ---------------------------------------------------------------------------

class _PinnedKeyPolicy(paramiko.MissingHostKeyPolicy):
    """No key is pinned: report the offered one, accept nothing."""

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec

    def missing_host_key(self, client, hostname, key) -> None:
        raise AgentError("host-key-pending", f"node {self.spec.name}: host key {key.fingerprint} is not accepted yet; "
                                             "an engineer must compare and accept it", offered_key=key_text(key),
                         node=self.spec.name)


class NodeConnection:
    """One SSH connection to a node, through its jump host if it has one."""

    def __init__(self, spec: NodeSpec, agent_key: str, *, timeouts: Timeouts = DEFAULT_TIMEOUTS,
                 policy: AddressPolicy | None = None) -> None:
        self.spec = spec
        self.agent_key = agent_key
        self.timeouts = timeouts
        self.policy = policy or AddressPolicy()
        self._client: paramiko.SSHClient | None = None
        self._jump: NodeConnection | None = None

    def __enter__(self) -> NodeConnection:
        return self if self._client is not None else self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def transport(self) -> paramiko.Transport:
        transport = self._client.get_transport() if self._client is not None else None
        if transport is None:
            raise AgentError("connection-lost", f"node {self.spec.name}: not connected", before_start=True)
        return transport

    def alive(self) -> bool:
        transport = self._client.get_transport() if self._client is not None else None
        return transport is not None and transport.is_active()

    def open(self) -> NodeConnection:
        if self._client is not None:
            return self
        spec, t = self.spec, self.timeouts
        pkey = open_key(spec, self.agent_key)
        pinned = _pinned_key(spec.host_key, spec.name) if spec.host_key else None
        where = f"node {spec.name} ({spec.host}:{spec.port})"
        try:   # the customer's address policy, before any connect (runners/agent/policy.py)
            if spec.jump:
                self.policy.check_literal(spec.host, spec.port, what=where)
                found = None
            else:
                found = self.policy.resolve(spec.host, spec.port, what=where)
        except Refused as exc:
            raise AgentError("invalid", f"refused by the site agent's address policy: {exc}", node=spec.name) from None
        except socket.gaierror as exc:
            if exc.errno == socket.EAI_AGAIN:
                raise AgentError("unreachable", f"{where}: name lookup of {spec.host} failed for now "
                                                f"({exc.strerror})") from None
            raise AgentError("invalid", f"{where}: cannot resolve host name {spec.host} ({exc.strerror})") from None
        sock = self._through_jump_host() if spec.jump else None
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_PinnedKeyPolicy(spec))
        if pinned is not None:
            client.get_host_keys().add(spec.known_hosts_name, pinned.get_name(), pinned)
        try:
            if sock is None:
                sock = connect(found, t.connect)
            client.connect(spec.host, port=spec.port, username=spec.username, pkey=pkey, sock=sock,
                           timeout=t.connect, banner_timeout=t.banner, auth_timeout=t.auth, channel_timeout=t.channel,
                           look_for_keys=False, allow_agent=False)
        except AgentError:
            self._abort(client)
            raise
        except paramiko.BadHostKeyException as exc:
            self._abort(client)
            raise AgentError("host-key-changed", f"{where}: offered host key {exc.key.fingerprint}, not the accepted "
                                                 f"{exc.expected_key.fingerprint}; nothing was sent to it",
                             offered_key=key_text(exc.key), node=spec.name) from None
        except paramiko.AuthenticationException as exc:
            self._abort(client)
            raise AgentError("auth", f"{where}: authentication refused for user {spec.username} with key "
                                     f"{pkey.fingerprint} ({exc})") from None
        except socket.gaierror as exc:
            self._abort(client)
            if exc.errno == socket.EAI_AGAIN:
                raise AgentError("unreachable", f"{where}: name lookup of {spec.host} failed for now "
                                                f"({exc.strerror})") from None
            raise AgentError("invalid", f"{where}: cannot resolve host name {spec.host} ({exc.strerror})") from None
        except TimeoutError:
            self._abort(client)
            raise AgentError("unreachable", f"{where}: no answer within {t.connect:g} s (timed out)") from None
        except (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError, OSError) as exc:
            self._abort(client)
            raise AgentError("unreachable", f"{where}: cannot connect ({exc})") from None
        except (paramiko.SSHException, EOFError) as exc:
            self._abort(client)
            raise AgentError("unreachable", f"{where}: SSH handshake failed ({exc or type(exc).__name__})") from None
        client.get_transport().set_keepalive(t.keepalive)
        self._client = client
        return self

    def _through_jump_host(self) -> paramiko.Channel:
        jump = NodeConnection(self.spec.jump, self.agent_key, timeouts=self.timeouts, policy=self.policy).open()
        try:
            channel = jump.transport.open_channel("direct-tcpip", (self.spec.host, self.spec.port), ("127.0.0.1", 0),
                                                  timeout=self.timeouts.connect)
        except (paramiko.ChannelException, paramiko.SSHException, EOFError, OSError) as exc:
            jump.close()
            raise AgentError("unreachable", f"node {self.spec.name}: jump host {self.spec.jump.name} cannot reach "
                                            f"{self.spec.host}:{self.spec.port} ({exc})") from None
        self._jump = jump
        return channel

    def _abort(self, client: paramiko.SSHClient) -> None:
        client.close()
        if self._jump is not None:
            self._jump.close()
            self._jump = None

    def close(self) -> None:
        for closer in (self._client, self._jump):
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # noqa: BLE001 — closing a dead connection must never mask the real error
                    pass
        self._client = self._jump = None

    # --- commands ---

    def run(self, command: str, *, timeout: float | None = None, output: Callable[[str, bytes], None] | None = None,
            stop: threading.Event | None = None) -> int:
        """Run ``command``; hand each piece of output to ``output(stream, data)``; its exit code.

        Raises AgentError (timeout, connection-lost) or Stopped when ``stop`` is set while it runs."""
        if not isinstance(command, str) or not command:
            raise AgentError("invalid", "the call's command is empty")
        label = command if len(command) <= 120 else command[:119] + "…"
        transport = self.transport
        try:
            chan = transport.open_session(timeout=self.timeouts.channel)
            chan.exec_command(command)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise AgentError("connection-lost", f"node {self.spec.name}: cannot open a session "
                                                f"({exc or type(exc).__name__})", before_start=True) from None
        started = time.monotonic()
        deadline = started + timeout if timeout else None
        try:
            while True:
                busy = False
                while chan.recv_ready():
                    data = chan.recv(CHUNK)
                    if output and data:
                        output("stdout", data)
                    busy = True
                while chan.recv_stderr_ready():
                    data = chan.recv_stderr(CHUNK)
                    if output and data:
                        output("stderr", data)
                    busy = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if not transport.is_active():
                    raise AgentError("connection-lost", f"node {self.spec.name}: connection lost during `{label}`")
                if deadline is not None and time.monotonic() > deadline:
                    chan.close()
                    raise AgentError("timeout", f"node {self.spec.name}: `{label}` still running after {timeout:g} s; "
                                                "channel closed")
                if stop is not None and stop.is_set():
                    chan.close()
                    raise Stopped(f"`{label}` stopped after {time.monotonic() - started:.0f} s")
                if not busy:
                    time.sleep(0.02)
        except (EOFError, OSError, paramiko.SSHException) as exc:
            raise AgentError("connection-lost", f"node {self.spec.name}: connection lost during `{label}` "
                                                f"({exc or type(exc).__name__})") from None
        code = chan.exit_status
        status_received = chan.status_event.is_set() and code != -1
        chan.close()
        if not status_received:
            raise AgentError("connection-lost", f"node {self.spec.name}: connection lost during `{label}` "
                                                "(no exit status)")
        return code

    def capture(self, command: str, *, timeout: float = 600) -> tuple[int, bytes, bytes]:
        out, err = bytearray(), bytearray()

        def keep(stream: str, data: bytes) -> None:
            target = out if stream == "stdout" else err
            if len(target) < 1 << 20:
                target.extend(data)

        code = self.run(command, timeout=timeout, output=keep)
        return code, bytes(out), bytes(err)

    def sha256(self, path: str) -> str:
        code, out, err = self.capture(f"sha256sum -- {shell_path(path)}")
        digest = out.decode("utf-8", "replace").split(" ", 1)[0].lstrip("\\").strip()
        if code != 0 or not _HASH.fullmatch(digest):
            raise AgentError("io", f"node {self.spec.name}: sha256sum printed no hash for {path} (exit {code}: "
                                   f"{(err or out)[:200].decode('utf-8', 'replace').strip()})")
        return digest

    # --- files ---

    def sftp(self) -> paramiko.SFTPClient:
        try:
            client = self._client.open_sftp() if self._client is not None else None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise AgentError("connection-lost", f"node {self.spec.name}: cannot open SFTP ({exc or type(exc).__name__})",
                             before_start=True) from None
        if client is None:
            raise AgentError("connection-lost", f"node {self.spec.name}: not connected", before_start=True)
        client.get_channel().settimeout(max(self.timeouts.channel, 60.0))
        return client

    def _file_error(self, what: str, exc: BaseException) -> AgentError:
        if not self.alive():
            return AgentError("connection-lost", f"node {self.spec.name}: connection lost while {what}")
        return AgentError("io", f"node {self.spec.name}: cannot finish {what} ({exc or type(exc).__name__})")

    def put(self, source, path: str, *, sha256: str, mode: int | None = None, size: int | None = None) -> str:
        """Write ``source`` (``read(n)``) to ``path.part``, hash it on the node, compare, chmod, rename: the node's hash.

        On a hash that is not ``sha256`` the .part is removed and AgentError(io) raised. An exception raised by
        ``source.read`` leaves no .part behind and goes up unchanged (the caller may fetch the payload again)."""
        _check_path(path)
        part = path + ".part"
        expected = str(sha256 or "").lower()
        if not _HASH.fullmatch(expected):
            raise AgentError("invalid", f"the put of {path} names no SHA-256 to compare with ({sha256!r})")
        sftp = self.sftp()
        try:
            sent = hashlib.sha256()
            count = 0
            reading = False
            try:
                with sftp.open(sftp_path(part), "wb") as handle:
                    handle.set_pipelined(True)
                    while True:
                        reading = True
                        data = source.read(1 << 20)
                        reading = False
                        if not data:
                            break
                        sent.update(data)
                        count += len(data)
                        handle.write(data)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                self._quiet_remove(sftp, part)
                if reading:  # the payload's source, not the node
                    raise
                raise self._file_error(f"writing {part}", exc) from None
            except BaseException:
                self._quiet_remove(sftp, part)
                raise
            if size is not None and count != size:
                self._quiet_remove(sftp, part)
                raise AgentError("io", f"the payload of {path} had {count} bytes, not the {size} announced")
            remote = self.sha256(part)
            if remote != expected:
                self._quiet_remove(sftp, part)
                raise AgentError("io", f"node {self.spec.name}: upload of {path} corrupted: expected SHA-256 {expected}, "
                                       f"the node has {remote} (sent {sent.hexdigest()}); {part} removed")
            try:
                if mode is not None:
                    sftp.chmod(sftp_path(part), int(mode))
                sftp.posix_rename(sftp_path(part), sftp_path(path))
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise self._file_error(f"the upload of {path}", exc) from None
            return remote
        finally:
            sftp.close()

    @staticmethod
    def _quiet_remove(sftp: paramiko.SFTPClient, path: str) -> None:
        try:
            sftp.remove(sftp_path(path))
        except (OSError, EOFError, paramiko.SSHException):
            pass

    @contextlib.contextmanager
    def reader(self, path: str):
        """A remote file open for reading, streamed (prefetched), with ``size``; read errors become AgentError."""
        _check_path(path)
        sftp = self.sftp()
        try:
            try:
                size = sftp.stat(sftp_path(path)).st_size
                handle = sftp.open(sftp_path(path), "rb")
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise self._file_error(f"opening {path}", exc) from None
            try:
                handle.prefetch(size)
                yield RemoteFile(self, handle, path, size)
            finally:
                handle.close()
        finally:
            sftp.close()


class RemoteFile:
    """``read(n)`` over an SFTP file, never past the size it had when opened."""

    def __init__(self, conn: NodeConnection, handle, path: str, size: int) -> None:
        self._conn = conn
        self._handle = handle
        self.path = path
        self.size = size
        self._left = size

    def read(self, size: int = -1) -> bytes:
        want = self._left if size is None or size < 0 else min(size, self._left)
        if want <= 0:
            return b""
        try:
            data = self._handle.read(want)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self._conn._file_error(f"reading {self.path}", exc) from None
        if not data:
            raise AgentError("io", f"node {self._conn.spec.name}: {self.path} ended {self._left} bytes early "
                                   "(it shrank while being read)")
        self._left -= len(data)
        return data


# --- the cache --------------------------------------------------------------------------------

@dataclass
class _Entry:
    conn: NodeConnection
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)


class Connections:
    """Connections per node spec, kept 60 s after their last use; thread-safe."""

    def __init__(self, agent_key: str, *, idle: float = 60.0, timeouts: Timeouts = DEFAULT_TIMEOUTS,
                 policy: AddressPolicy | None = None) -> None:
        self.agent_key = agent_key
        self.policy = policy or AddressPolicy()
        self.idle = idle
        self.timeouts = timeouts
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._opening: dict[str, threading.Lock] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _take(self, spec: NodeSpec, *, fresh: bool) -> tuple[_Entry, bool]:
        key = spec.cache_key
        with self._lock:
            opening = self._opening.setdefault(key, threading.Lock())
        with opening:  # one handshake per spec at a time; the others then share it
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and (fresh or not entry.conn.alive()):
                    self._entries.pop(key)
                    if entry.users == 0:
                        entry.conn.close()
                    entry = None
                if entry is not None:
                    entry.users += 1
                    return entry, True
            conn = NodeConnection(spec, self.agent_key, timeouts=self.timeouts, policy=self.policy).open()
            entry = _Entry(conn, users=1)
            with self._lock:
                self._entries[key] = entry
            return entry, False

    def _give_back(self, spec: NodeSpec, entry: _Entry, *, broken: bool) -> None:
        with self._lock:
            entry.users -= 1
            entry.last_used = time.monotonic()
            current = self._entries.get(spec.cache_key) is entry
            if broken and current:
                self._entries.pop(spec.cache_key)
            if entry.users == 0 and (broken or not current):
                entry.conn.close()

    def call(self, spec: NodeSpec, work: Callable[[NodeConnection], object]):
        """``work(conn)`` on a connection to ``spec``; a cached one found dead before any work is replaced once."""
        entry, cached = self._take(spec, fresh=False)
        try:
            result = work(entry.conn)
        except AgentError as exc:
            dead = exc.kind == "connection-lost" or not entry.conn.alive()
            self._give_back(spec, entry, broken=dead)
            if not (cached and dead and exc.before_start):
                raise
        except BaseException:
            self._give_back(spec, entry, broken=not entry.conn.alive())
            raise
        else:
            self._give_back(spec, entry, broken=False)
            return result
        entry, _cached = self._take(spec, fresh=True)
        try:
            result = work(entry.conn)
        except BaseException:
            self._give_back(spec, entry, broken=not entry.conn.alive())
            raise
        self._give_back(spec, entry, broken=False)
        return result

    def reap(self) -> int:
        """Close the connections unused for ``idle`` seconds, and the dead ones; how many were closed."""
        now = time.monotonic()
        closing = []
        with self._lock:
            for key, entry in list(self._entries.items()):
                if entry.users == 0 and (now - entry.last_used >= self.idle or not entry.conn.alive()):
                    closing.append(self._entries.pop(key).conn)
            for key in [k for k, lock in self._opening.items() if k not in self._entries and not lock.locked()]:
                self._opening.pop(key)
        for conn in closing:
            conn.close()
        return len(closing)

    def close_all(self) -> None:
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
        for entry in entries:
            entry.conn.close()
