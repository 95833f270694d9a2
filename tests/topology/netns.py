"""Two networks on one machine: the web tier (this namespace) and a "customer network" (a network namespace).

    with CustomerNetwork() as net:        # ip netns + a veth pair, removed on exit (needs root)
        net.web_address                    # 10.231.N.1: the web tier as the customer network sees it
        net.run([...])                     # a process inside the customer network
        net.forward(5432)                  # web_address:P → 127.0.0.1:5432 (PostgreSQL, Redis listen on loopback)

A namespace whose session was killed before it could remove it is removed by the next one (`_remove_orphans`).
"""
from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import threading
from pathlib import Path


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "needs iproute2 (ip) and util-linux (unshare)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


# Who made each namespace (its pid and start time): a session killed before its teardown leaves its namespace and
# veth pair behind, and the next one removes them (`_remove_orphans`). Processes it left inside end with their
# session's watcher (they carry its mark: tests/envsetup.py).
OWNERS = Path("/run/fxpilot-netns")


def _started(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _remove_orphans() -> None:
    for record in OWNERS.glob("fxp-cust-*") if OWNERS.is_dir() else ():
        try:
            pid, started, web_if = record.read_text().split()
        except (OSError, ValueError):
            continue
        if _started(int(pid)) == started:
            continue  # its session still runs
        found = subprocess.run(["ip", "netns", "pids", record.name], capture_output=True, text=True)
        if found.stdout.split():
            continue  # something still lives in it: not this one's to end
        subprocess.run(["ip", "link", "del", web_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", record.name], capture_output=True)
        record.unlink(missing_ok=True)


class CustomerNetwork:
    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}{random.randint(0, 99):02d}"
        self.name = f"fxp-cust-{tag}"
        self.web_if, self.cust_if = f"fxw{tag}"[:15], f"fxc{tag}"[:15]
        octet = random.randint(1, 250)
        self.web_address, self.customer_address = f"10.231.{octet}.1", f"10.231.{octet}.2"
        self._listeners: list[socket.socket] = []
        self._stop = threading.Event()

    def __enter__(self) -> CustomerNetwork:
        _remove_orphans()
        OWNERS.mkdir(mode=0o700, exist_ok=True)
        (OWNERS / self.name).write_text(f"{os.getpid()} {_started(os.getpid())} {self.web_if}\n")
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.web_if, "type", "veth", "peer", "name", self.cust_if)
            _ip("link", "set", self.cust_if, "netns", self.name)
            _ip("addr", "add", f"{self.web_address}/30", "dev", self.web_if)
            _ip("link", "set", self.web_if, "up")
            _ip("netns", "exec", self.name, "ip", "addr", "add", f"{self.customer_address}/30", "dev", self.cust_if)
            _ip("netns", "exec", self.name, "ip", "link", "set", self.cust_if, "up")
            _ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for listener in self._listeners:
            listener.close()
        self.kill_everything_inside()
        subprocess.run(["ip", "link", "del", self.web_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        (OWNERS / self.name).unlink(missing_ok=True)

    def pids(self) -> list[int]:
        """Every process living in the customer network (whatever session or group it made for itself)."""
        found = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True)
        return [int(pid) for pid in found.stdout.split() if pid.isdigit()] if found.returncode == 0 else []

    def kill_everything_inside(self, timeout: float = 5) -> None:
        """SIGTERM, then SIGKILL, to whatever still runs in the namespace: it is the test's own, all of it
        (servers the simulated nodes detached with setsid escape their parent's process group, not this)."""
        import signal
        import time

        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, timeout)):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.1)

    def exists(self) -> bool:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        return self.name in listed

    def argv(self, argv: list[str], *, hide: list[str] = ()) -> list[str]:
        """argv run inside the customer network; each folder in `hide` is covered by an empty tmpfs there."""
        inner = list(argv)
        if hide:
            mounts = " && ".join(f"mount -t tmpfs -o size=1m,mode=000 fxpilot-hidden {_q(path)}" for path in hide)
            inner = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", f'{mounts} && exec "$@"', "sh",
                     *argv]
        return ["ip", "netns", "exec", self.name, *inner]

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(argv), **kwargs)

    def forward(self, target_port: int, target_host: str = "127.0.0.1") -> int:
        """Listen on web_address (a free port) and relay each connection to target_host:target_port."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.web_address, 0))
        listener.listen(64)
        self._listeners.append(listener)

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for sock in (src, dst):
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        def accept() -> None:
            while not self._stop.is_set():
                try:
                    client, _ = listener.accept()
                except OSError:
                    return
                try:
                    upstream = socket.create_connection((target_host, target_port), timeout=10)
                    upstream.settimeout(None)
                except OSError:
                    client.close()
                    continue
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=pump, args=(a, b), daemon=True).start()

        threading.Thread(target=accept, daemon=True, name=f"forward-{target_port}").start()
        return listener.getsockname()[1]


def _q(text: str) -> str:
    import shlex

    return shlex.quote(text)
