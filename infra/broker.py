"""The message broker: the embedded Redis server and the Redis transport the workers use.

**The embedded broker.** Without `CELERY_BROKER_URL`, fxpilot uses a Redis server of its own on a
Unix socket under `$FXPILOT_DATA_DIR/redis/` (Debian's `redis-server`), so the embedded default
runs the same transport as production. `manage.py demo` and the test suite start and stop it
themselves; any other process of the embedded default (`manage.py worker`, the portal, `run_gate`)
that finds no server there starts one in the background, and it keeps running like a local service
(`manage.py broker stop` ends it). Only the socket is served (no TCP port); it is mode 0700.

**The transport** (`Transport` below, registered for `redis://` and `rediss://` by
`use_fxpilot_transport`) is kombu's Redis transport with two repairs, both covered by
tests/broker:

* A worker whose broker restarts must reconnect, not exit. In kombu 5.7, when the consumer's
  connection breaks, Celery first calls `Connection.collect()`, which detaches the transport from
  its connection (`transport.client = None`) after a close of the channel that failed half-way (the
  channel was waiting in BRPOP); Celery then closes the connection again, the channel's close
  restores its unacknowledged messages, and building a new client for that reads
  `transport.client.hostname`: `AttributeError: 'NoneType' object has no attribute 'hostname'`,
  which Celery treats as unrecoverable. Our channel remembers the connection's parameters, so that
  restore reaches the server (or fails with a connection error, which Celery handles).
  If the server is still down then, the messages the worker held (reserved, or waiting for their
  countdown) stay in the server's unacknowledged set, which Redis would only give back after the
  visibility timeout (an hour): the channel of the next working connection puts them back at once.
* A message that is not a message (bytes that are not JSON, JSON that is not kombu's envelope) is
  logged with its queue and dropped instead of escaping the event loop and ending the worker. A
  well-formed message Celery cannot use (unregistered task, undecodable body, bad arguments) is
  already logged and rejected by Celery itself.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from celery import current_app
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import Empty

log = logging.getLogger("fxpilot.broker")

# A Unix socket path must fit in sockaddr_un (108 bytes with the terminating NUL).
_MAX_SOCKET_PATH = 100


# ── The embedded Redis server ─────────────────────────────────────────────────────────────────


def embedded_dir(data_dir: Path | str) -> Path:
    return Path(data_dir) / "redis"


def embedded_socket(data_dir: Path | str) -> Path:
    """Where the embedded server listens: under the data folder, or a short private path when that is too long."""
    path = embedded_dir(data_dir).resolve() / "redis.sock"
    if len(str(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"fxpilot-redis-{os.getuid()}-{digest}" / "redis.sock"


def embedded_url(data_dir: Path | str) -> str:
    return f"redis+socket://{embedded_socket(data_dir)}"


def socket_of(url: str) -> Path | None:
    """The socket path of a `redis+socket://PATH` or `socket://PATH` URL, else None."""
    for prefix in ("redis+socket://", "socket://"):
        if url.startswith(prefix):
            return Path(url[len(prefix):].split("?", 1)[0])
    return None


def ping(sock: Path | str, timeout: float = 1.0) -> bool:
    """True when a Redis server answers PING on this Unix socket."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(sock))
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def redis_server_binary() -> str:
    found = shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if not found:
        raise RuntimeError("the embedded broker needs Debian's redis-server (apt-get install redis-server; "
                           "`make demo` and `make test` install it), or set CELERY_BROKER_URL")
    return found


def server_argv(data_dir: Path | str, *, daemonize: bool, persistent: bool = True) -> list[str]:
    """redis-server on the embedded socket only; with `persistent`, an append-only file keeps messages over a restart."""
    folder = embedded_dir(data_dir).resolve()
    sock = embedded_socket(data_dir)
    argv = [redis_server_binary(), "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
            "--dir", str(folder), "--pidfile", str(folder / "redis.pid"), "--logfile", str(folder / "redis.log"),
            "--save", "", "--daemonize", "yes" if daemonize else "no"]
    argv += ["--appendonly", "yes", "--appendfsync", "everysec"] if persistent else ["--appendonly", "no"]
    return argv


def prepare(data_dir: Path | str) -> Path:
    folder = embedded_dir(data_dir)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    sock = embedded_socket(data_dir)
    sock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if sock.exists() and not ping(sock):
        sock.unlink()  # left by a server that was killed
    return sock


def wait_ready(sock: Path, timeout: float, proc: subprocess.Popen | None = None, log_file: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ping(sock, timeout=0.5):
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = log_file.read_text(errors="replace")[-1500:] if log_file and log_file.exists() else ""
    raise RuntimeError(f"the embedded Redis server on {sock} did not start{': ' + tail if tail else ''}")


def start_child(data_dir: Path | str, *, persistent: bool = True, preexec_fn=None,
                timeout: float = 20.0) -> subprocess.Popen:
    """Start the embedded server as a child of this process (the demo, the test session), ready when this returns."""
    sock = prepare(data_dir)
    argv = server_argv(data_dir, daemonize=False, persistent=persistent)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=preexec_fn)
    try:
        wait_ready(sock, timeout, proc, embedded_dir(data_dir) / "redis.log")
    except BaseException:
        stop_child(proc)
        raise
    return proc


def stop_child(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def ensure_running(data_dir: Path | str, timeout: float = 20.0) -> bool:
    """Start the embedded server in the background unless it answers already; True when this call started it."""
    sock = embedded_socket(data_dir)
    if ping(sock):
        return False
    folder = embedded_dir(data_dir)
    lock_path = folder / "start.lock"
    prepare(data_dir)
    import fcntl

    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two processes starting at once start one server
        if ping(sock):
            return False
        subprocess.run(server_argv(data_dir, daemonize=True), check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
        wait_ready(sock, timeout, log_file=folder / "redis.log")
    log.info("started the embedded Redis broker on %s", sock)
    return True


def stop_background(data_dir: Path | str, timeout: float = 10.0) -> bool:
    """Stop a background embedded server started by `ensure_running`; True when one was running."""
    pid_file = embedded_dir(data_dir) / "redis.pid"
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return True


def restore_unacked() -> int:
    """Put every message taken but not acknowledged back on its queue, now; returns how many.

    Only for when no worker is alive (the demo after its worker died): a live worker's messages
    would run twice. Otherwise Redis restores them after the visibility timeout. The connection is
    the current Celery app's (the project's, fxpilot.celery), reached as runners.dispatch reaches it:
    this module imports nothing of the project.
    """
    with current_app.connection_for_write() as conn:
        channel = conn.default_channel
        client = channel.client
        tags = [tag.decode() if isinstance(tag, bytes) else tag for tag in client.hkeys(channel.unacked_key)]
        for tag in tags:
            channel.qos.restore_by_tag(tag, client=client, leftmost=True)
    return len(tags)


# ── The transport ─────────────────────────────────────────────────────────────────────────────


# Delivery tags this process took and could not put back when its connection broke (the server was
# down): put back as soon as a new connection works. Only a consumer's main process has any.
_unrestored: set[str] = set()
# Messages taken off a queue whose entry in the unacknowledged set could not be written (the server
# went down between the two): nothing else has them, so they are pushed back once it answers again.
_unsaved: list[tuple[dict, str, str]] = []


class QoS(kombu_redis.QoS):
    def append(self, message, delivery_tag):
        try:
            return super().append(message, delivery_tag)
        except self.channel.connection.connection_errors:
            delivery = message.delivery_info
            _unsaved.append((message._raw, delivery["exchange"], delivery["routing_key"]))
            raise

    def restore_unacked(self, client=None):
        try:
            return super().restore_unacked(client)
        except self.channel.connection.connection_errors as exc:
            tags = list(self._delivered)
            self._delivered.clear()
            _unrestored.update(tags)
            log.warning("the broker is unreachable (%s): %d unacknowledged message(s) go back to their queues "
                        "once it answers again", exc, len(tags))


class Channel(kombu_redis.Channel):
    QoS = QoS

    def __init__(self, connection, *args, **kwargs):
        # Kept for the restore of unacknowledged messages after Connection.collect() detached the transport.
        self._fxpilot_conninfo = connection.client
        super().__init__(connection, *args, **kwargs)
        if _unrestored or _unsaved:
            self._restore_left_behind()

    def _restore_left_behind(self) -> None:
        tags, unsaved = list(_unrestored), list(_unsaved)
        with self.conn_or_acquire() as client:
            for tag in tags:
                self.qos.restore_by_tag(tag, client=client, leftmost=True)
                _unrestored.discard(tag)
            for payload, exchange, routing_key in unsaved:
                with client.pipeline() as pipe:
                    self._do_restore_message(payload, exchange, routing_key, pipe, leftmost=True)
                    pipe.execute()
                _unsaved.remove((payload, exchange, routing_key))
        log.warning("put %d message(s) left by the broken connection back on their queues", len(tags) + len(unsaved))

    def _connparams(self, asynchronous: bool = False) -> dict:
        transport = self.connection
        if transport is not None and transport.client is None and self._fxpilot_conninfo is not None:
            transport.client = self._fxpilot_conninfo
            try:
                return super()._connparams(asynchronous=asynchronous)
            finally:
                transport.client = None
        return super()._connparams(asynchronous=asynchronous)

    def _brpop_read(self, **options):
        try:
            return super()._brpop_read(**options)
        except (ValueError, KeyError, TypeError) as exc:
            # The item was popped: the bad message is dropped here, and the worker goes on.
            log.error("dropped a message that is not a valid message (%s: %s)", type(exc).__name__, exc, exc_info=True)
            return True

    def _get(self, queue):
        try:
            return super()._get(queue)
        except ValueError as exc:
            log.error("dropped a message from queue %s that is not JSON (%s)", queue, exc)
            raise Empty() from None


class Transport(kombu_redis.Transport):
    Channel = Channel

    def _deliver(self, message, queue):
        if not isinstance(message, dict) or not isinstance(message.get("properties"), dict) or "body" not in message:
            log.error("dropped a message from queue %s that is not a kombu message: %.200r", queue, message)
            return
        super()._deliver(message, queue)

    def establish_connection(self):
        data_dir = (self.client.transport_options or {}).get("fxpilot_embedded_data_dir") if self.client else None
        if data_dir and os.environ.get("FXPILOT_BROKER_AUTOSTART", "1") != "0":
            ensure_running(data_dir)
        return super().establish_connection()


def use_fxpilot_transport() -> None:
    """redis:// and rediss:// URLs (and redis+socket://) use the transport above."""
    from kombu import transport

    for alias in ("redis", "rediss"):
        TRANSPORT_ALIASES[alias] = "infra.broker:Transport"
        transport._transport_cache.pop(alias, None)
