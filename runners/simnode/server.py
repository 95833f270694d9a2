"""The simulated node's SSH server (paramiko): exec requests run in a real ``bash -c``, SFTP inside the sandbox.

One thread per connection and per command. Faults come from the node's state.json, read at each
connection and command, so ``manage.py simnode fault`` changes a running node.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from runners.processes import kill_group, watched_environment
from runners.sim import diskstats
from runners.simnode import tools
from runners.simnode.state import default_state, link_shared_fx, load_state, save_state, state_path

log = logging.getLogger(__name__)
# A client hanging up is routine for a test server; paramiko would log each reset as an ERROR.
logging.getLogger("paramiko.simnode").setLevel(logging.CRITICAL)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = Path(__file__).resolve().parent / "bin"
PYLIB_DIR = Path(__file__).resolve().parent / "pylib"
# The node's `python3` (the workload client, the scans): the interpreter fxpilot runs on, found directly. Through the
# machine's PATH it may be a version manager's shim (pyenv's is a bash script: ~80 ms of CPU more per start, and a
# gate starts python3 on its nodes hundreds of times). After BIN_DIR, so that no simulated tool is shadowed.
NODE_PYTHON_DIR = str(Path(sys.base_prefix) / "bin") if os.access(Path(sys.base_prefix) / "bin" / "python3", os.X_OK) else None
DEFAULT_USERNAME = "fxpilot"
# The Hugging Face cache folder of the simulated deployment's model (runners.config.DEFAULT_SIMULATED).
SIMULATED_MODEL_CACHE = "models--Qwen--Qwen3-Coder-480B-A35B-Instruct-FP8"


def generate_ed25519(path: Path, comment: str = "fxpilot-simnode") -> paramiko.Ed25519Key:
    """Write a new OpenSSH Ed25519 private key (0600) and its .pub; return it as a paramiko key."""
    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(pem)
    tmp.chmod(0o600)
    os.replace(tmp, path)
    key = paramiko.Ed25519Key.from_private_key_file(str(path))
    path.with_name(path.name + ".pub").write_text(f"{key.get_name()} {key.get_base64()} {comment}\n")
    return key


def read_public_keys(path: Path) -> list[tuple[str, str]]:
    """(type, base64) pairs of an authorized_keys file."""
    keys = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and not line.startswith("#"):
                keys.append((parts[0], parts[1]))
    return keys


class SimNodeServer:
    """One simulated GPU node: an SSH server on ``host:port`` whose home and $FXPILOT_SIM_ROOT is ``root``."""

    def __init__(self, root: Path | str, name: str, *, authorized_keys: Path | str, host_key: Path | str | None = None,
                 username: str = DEFAULT_USERNAME, host: str = "127.0.0.1", port: int = 0, time_scale: float = 0.01,
                 fx_array: Path | str | None = None) -> None:
        self.root = Path(root).resolve()
        self.fx_array = Path(fx_array).resolve() if fx_array else None
        self.name = name
        self.authorized_keys = Path(authorized_keys)
        self.host_key_path = Path(host_key) if host_key else self.root.parent / f"{name}.host_key"
        self.username, self.host, self.port, self.time_scale = username, host, port, time_scale
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._transports: set[paramiko.Transport] = set()
        self._processes: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # --- lifecycle ---

    def prepare(self) -> None:
        """Sandbox, state.json, simulated sysfs and host key, created once and kept across restarts."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not state_path(self.root).exists():
            save_state(self.root, default_state(self.root, self.name, self.time_scale))
        state = load_state(self.root)
        if self.fx_array is not None and state["fx"].get("shared_dir") != str(self.fx_array):
            state["fx"]["shared_dir"] = str(self.fx_array)
            save_state(self.root, state)
        Path(state["local_nvme"]["path"]).mkdir(parents=True, exist_ok=True)
        if state["fx"].get("mounted_at"):
            link_shared_fx(state["fx"]["mounted_at"], state)
        else:
            (self.root / "mnt" / "fx").mkdir(parents=True, exist_ok=True)
        speed = self.root / "sys" / "class" / "nvme" / "nvme0" / "device"
        speed.mkdir(parents=True, exist_ok=True)
        (speed / "current_link_speed").write_text("16.0 GT/s PCIe\n")
        (speed / "current_link_width").write_text("4\n")
        (self.root / "sys" / "class" / "nvme" / "nvme0" / "transport").write_text("pcie\n")
        (self.root / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1").mkdir(parents=True, exist_ok=True)
        model_cache = self.root / ".cache" / "huggingface" / "hub" / SIMULATED_MODEL_CACHE / "snapshots" / "simulated"
        if not (model_cache / "config.json").exists():
            # the simulated server needs no weights; the cache entry is what a node that downloaded the model has
            model_cache.mkdir(parents=True, exist_ok=True)
            (model_cache / "config.json").write_text('{"simulated": true, "note": "Simulated - not evidence"}\n')
        if not self.host_key_path.exists():
            generate_ed25519(self.host_key_path, comment=f"simnode-{self.name}-host")
        if not self.meminfo_path.exists():
            self.meminfo_path.parent.mkdir(parents=True, exist_ok=True)
            self.meminfo_path.write_text(tools.meminfo_text())
        diskstats.ensure(self.diskstats_path, [(8, 0, "sda"), (8, 2, "sda2"),
                                               (259, 0, diskstats.device_name(state["local_nvme"]["namespace"])),
                                               (259, 1, diskstats.device_name(state["fx"]["namespace"]))])

    @property
    def meminfo_path(self) -> Path:
        """The node's /proc/meminfo (FXPILOT_MEMINFO in every command), the memory the simulated `free` shows."""
        return self.root / "proc" / "meminfo"

    @property
    def diskstats_path(self) -> Path:
        """The node's block-device counters in /proc/diskstats format (FXPILOT_DISKSTATS in every command): the
        simulated server adds its disk tiers' reads and writes to them."""
        return self.root / "proc" / "diskstats"

    def start(self) -> SimNodeServer:
        self.prepare()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._thread = threading.Thread(target=self._accept_loop, name=f"simnode-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            except OSError:
                pass
            self._listener.close()
        with self._lock:
            transports, processes = list(self._transports), list(self._processes)
        for proc in processes:
            kill_group(proc)
        # A node that stops takes its detached work with it (those left their session on purpose).
        _kill_sandbox_processes(self.root)
        for transport in transports:
            transport.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> SimNodeServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def host_key(self) -> paramiko.Ed25519Key:
        return paramiko.Ed25519Key.from_private_key_file(str(self.host_key_path))

    @property
    def fingerprint(self) -> str:
        return self.host_key.fingerprint

    def rekey(self) -> str:
        """A new host key (the "host key changed" fault); takes effect on the next connection."""
        return generate_ed25519(self.host_key_path, comment=f"simnode-{self.name}-host").fingerprint

    def state(self) -> dict:
        return load_state(self.root)

    # --- connections ---

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), name=f"simnode-{self.name}-conn", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        transport = paramiko.Transport(sock)
        transport.set_log_channel("paramiko.simnode")
        transport.add_server_key(self.host_key)
        transport.set_subsystem_handler("sftp", paramiko.SFTPServer, SandboxSFTP, root=self.root, node=self)
        with self._lock:
            self._transports.add(transport)
        interface = _Interface(self, transport)
        _start_commands_after_reply(transport, interface)
        try:
            transport.start_server(server=interface)
            channels = []  # held here: a channel object that is garbage-collected closes itself
            while transport.is_active() and not self._stopping.is_set():
                channel = transport.accept(timeout=0.5)
                channels = [c for c in channels if not c.closed] + ([channel] if channel is not None else [])
        except (paramiko.SSHException, EOFError, OSError) as exc:
            log.debug("simnode %s: connection ended: %s", self.name, exc)
        finally:
            transport.close()
            with self._lock:
                self._transports.discard(transport)

    def environment(self) -> dict[str, str]:
        state = load_state(self.root)
        env = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TZ", "TERM")}
        env.update({
            "HOME": str(self.root), "USER": self.username, "LOGNAME": self.username, "SHELL": "/bin/bash",
            "PATH": ":".join(filter(None, (str(self._bin_dir(state)), NODE_PYTHON_DIR,
                                          os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")))),
            "PYTHONPATH": f"{PROJECT_ROOT}:{PYLIB_DIR}", "FXPILOT_PYTHON": sys.executable,
            "FXPILOT_SIM_ROOT": str(self.root), "FXPILOT_SIM_NODE": self.name, "FXPILOT_SYSFS": str(self.root / "sys"),
            "FXPILOT_SIM_TIME_SCALE": str(state.get("time_scale", self.time_scale)), "FXPILOT_SIMULATED": "1",
            "FXPILOT_DISKSTATS": str(self.diskstats_path), "FXPILOT_MEMINFO": str(self.meminfo_path),
        })
        env.setdefault("LANG", "C.UTF-8")
        # What this node runs ends with the process that watches this server's own (infra.lifetime.start_watcher).
        env.update(watched_environment())
        return env

    def _bin_dir(self, state: dict) -> Path:
        """The simulated tools on the node's PATH: all of them, or (fault missing_tools) a folder without those."""
        missing = set(state["faults"].get("missing_tools") or [])
        if not missing:
            return BIN_DIR
        folder = self.root.parent / f".{self.name}-bin-{'-'.join(sorted(missing))}"
        if not folder.is_dir():
            staging = folder.with_name(folder.name + f".{os.getpid()}-{threading.get_ident()}")
            staging.mkdir(parents=True, exist_ok=True)
            for tool in BIN_DIR.iterdir():
                if tool.name not in missing and not (staging / tool.name).exists():
                    (staging / tool.name).symlink_to(tool)
            try:
                staging.rename(folder)
            except OSError:  # another command made it first
                shutil.rmtree(staging, ignore_errors=True)
        return folder

    def run_command(self, channel: paramiko.Channel, command: str) -> None:
        """Run one exec request in ``bash -c``; stream both outputs; send the exit status and close."""
        transport = channel.get_transport()
        faults = load_state(self.root)["faults"]
        started = time.monotonic()
        if faults.get("slow_command_seconds"):
            time.sleep(float(faults["slow_command_seconds"]))
        proc = subprocess.Popen(["bash", "-c", command], cwd=self.root, env=self.environment(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        with self._lock:
            self._processes.add(proc)
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, channel.sendall), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, channel.sendall_stderr), daemon=True)]
        for pump in pumps:
            pump.start()
        drop_after = faults.get("drop_ssh_after_seconds")
        try:
            while proc.poll() is None:
                if channel.closed or not transport.is_active() or self._stopping.is_set():
                    kill_group(proc)
                    return
                if drop_after is not None and time.monotonic() - started >= float(drop_after):
                    # The fault: the node's network goes away mid-command; the command dies with the session.
                    kill_group(proc)
                    transport.close()
                    return
                time.sleep(0.02)
            for pump in pumps:
                pump.join(timeout=10)
            channel.send_exit_status(proc.returncode if proc.returncode >= 0 else 128 - proc.returncode)
            channel.shutdown_write()
            channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            kill_group(proc)
        finally:
            with self._lock:
                self._processes.discard(proc)


def _start_commands_after_reply(transport: paramiko.Transport, interface: _Interface) -> None:
    """Start an exec'd command only once its request was answered: a quick command must not close first."""
    send = transport._send_user_message

    def send_then_start(message: paramiko.Message) -> None:
        send(message)
        raw = message.asbytes()
        if raw[:1] == bytes([paramiko.common.MSG_CHANNEL_SUCCESS]):
            thread = interface.waiting.pop(int.from_bytes(raw[1:5], "big"), None)
            if thread is not None:
                thread.start()

    transport._send_user_message = send_then_start


def _pump(stream, send) -> None:
    try:
        while chunk := os.read(stream.fileno(), 32768):
            send(chunk)
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        stream.close()


def _kill_sandbox_processes(root: Path) -> None:
    """SIGKILL every process started from this node's sandbox (its environment names the sandbox)."""
    markers = {f"FXPILOT_SIM_ROOT={path}".encode() for path in (root, Path(root).resolve())}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if markers.intersection(environment):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


class _Interface(paramiko.ServerInterface):
    def __init__(self, node: SimNodeServer, transport: paramiko.Transport) -> None:
        self.node, self.transport = node, transport
        self.waiting: dict[int, threading.Thread] = {}

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if load_state(self.node.root)["faults"].get("refuse_auth") or username != self.node.username:
            return paramiko.AUTH_FAILED
        offered = (key.get_name(), key.get_base64())
        return paramiko.AUTH_SUCCESSFUL if offered in read_public_keys(self.node.authorized_keys) else paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        text = command.decode("utf-8", errors="replace")
        self.waiting[channel.remote_chanid] = threading.Thread(target=self.node.run_command, args=(channel, text), daemon=True)
        return True


class _Handle(paramiko.SFTPHandle):
    def __init__(self, flags: int, node: SimNodeServer) -> None:
        super().__init__(flags)
        self.node = node

    def _corrupt(self) -> bool:
        return bool(load_state(self.node.root)["faults"].get("corrupt_transfers"))

    def write(self, offset, data):
        if offset == 0 and data and self._corrupt():
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return super().write(offset, data)

    def read(self, offset, length):
        data = super().read(offset, length)
        if offset == 0 and isinstance(data, bytes) and data and self._corrupt():
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return data

    def stat(self):
        try:
            return paramiko.SFTPAttributes.from_stat(os.fstat(self.readfile.fileno()))
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)

    def chattr(self, attr):
        try:
            paramiko.SFTPServer.set_file_attr(self.filename, attr)
            return paramiko.SFTP_OK
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)


class SandboxSFTP(paramiko.SFTPServerInterface):
    """SFTP confined to the sandbox: relative paths start at its root; absolute paths must lie inside it."""

    def __init__(self, server, *args, root: Path, node: SimNodeServer, **kwargs) -> None:
        super().__init__(server, *args, **kwargs)
        self.root, self.node = str(root), node

    def _real(self, path: str) -> str:
        joined = path if os.path.isabs(path) else os.path.join(self.root, path)
        real = os.path.realpath(joined)
        if real != self.root and not real.startswith(self.root + "/"):
            raise PermissionError(13, "outside the simulated node's sandbox")
        return real

    def _call(self, action):
        try:
            return action()
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)

    def canonicalize(self, path: str) -> str:
        joined = path if os.path.isabs(path) else os.path.join(self.root, path)
        return os.path.normpath(joined)

    def list_folder(self, path):
        def action():
            real = self._real(path)
            out = []
            for name in os.listdir(real):
                attr = paramiko.SFTPAttributes.from_stat(os.lstat(os.path.join(real, name)))
                attr.filename = name
                out.append(attr)
            return out
        return self._call(action)

    def stat(self, path):
        return self._call(lambda: paramiko.SFTPAttributes.from_stat(os.stat(self._real(path))))

    def lstat(self, path):
        return self._call(lambda: paramiko.SFTPAttributes.from_stat(os.lstat(self._real(path))))

    def open(self, path, flags, attr):
        def action():
            real = self._real(path)
            mode = getattr(attr, "st_mode", None) or 0o644
            fd = os.open(real, flags, mode & 0o7777)
            if flags & os.O_CREAT and attr is not None:
                attr._flags &= ~attr.FLAG_PERMISSIONS
                paramiko.SFTPServer.set_file_attr(real, attr)
            if flags & os.O_WRONLY:
                fmode = "ab" if flags & os.O_APPEND else "wb"
            elif flags & os.O_RDWR:
                fmode = "a+b" if flags & os.O_APPEND else "r+b"
            else:
                fmode = "rb"
            handle = _Handle(flags, self.node)
            handle.filename = real
            handle.readfile = handle.writefile = os.fdopen(fd, fmode)
            return handle
        return self._call(action)

    def remove(self, path):
        return self._call(lambda: (os.remove(self._real(path)), paramiko.SFTP_OK)[1])

    def rename(self, oldpath, newpath):
        def action():
            new = self._real(newpath)
            if os.path.exists(new):
                return paramiko.SFTP_FAILURE
            os.rename(self._real(oldpath), new)
            return paramiko.SFTP_OK
        return self._call(action)

    def posix_rename(self, oldpath, newpath):
        return self._call(lambda: (os.replace(self._real(oldpath), self._real(newpath)), paramiko.SFTP_OK)[1])

    def mkdir(self, path, attr):
        def action():
            real = self._real(path)
            os.mkdir(real)
            if attr is not None:
                paramiko.SFTPServer.set_file_attr(real, attr)
            return paramiko.SFTP_OK
        return self._call(action)

    def rmdir(self, path):
        return self._call(lambda: (os.rmdir(self._real(path)), paramiko.SFTP_OK)[1])

    def chattr(self, path, attr):
        return self._call(lambda: (paramiko.SFTPServer.set_file_attr(self._real(path), attr), paramiko.SFTP_OK)[1])

    def readlink(self, path):
        return self._call(lambda: os.readlink(self._real(path)))

    def symlink(self, target_path, path):
        return self._call(lambda: (os.symlink(target_path, self._real(path)), paramiko.SFTP_OK)[1])
