"""Starting and stopping simulated servers as subprocesses (simcheck and the tests)."""
from __future__ import annotations

import socket
import subprocess


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM (the server flushes its tier files), then SIGKILL after ``grace`` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
