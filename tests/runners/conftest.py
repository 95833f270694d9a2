"""Fixtures others reuse: simulated nodes over real SSH, an OpenSSH sshd on a loopback port, and a
Site/Credential/Node factory.

    def test_x(simnodes, make_node, job):
        server = simnodes(1)[0]                      # a running SimNodeServer (in-process)
        node = make_node(server)                     # a Node with the host key accepted
"""
from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra.lifetime import die_with_parent, watch_files, watched_environment
from runners.simnode.server import SimNodeServer, generate_ed25519
from runners.simnode.state import update_state

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@pytest.fixture(scope="session")
def user_key(tmp_path_factory) -> SimpleNamespace:
    """An Ed25519 user key pair: ``path`` (private, OpenSSH format), ``public`` (authorized_keys line)."""
    folder = tmp_path_factory.mktemp("user-key")
    key = generate_ed25519(folder / "id_ed25519", comment="fxpilot-tests")
    return SimpleNamespace(path=folder / "id_ed25519", text=(folder / "id_ed25519").read_text(), key=key,
                           public=(folder / "id_ed25519.pub").read_text())


@pytest.fixture
def simnodes(tmp_path, user_key):
    """Factory: ``simnodes(n, **faults)`` starts n simulated nodes in this process; all stop after the test."""
    started: list[SimNodeServer] = []
    base = tmp_path / "simnodes"
    base.mkdir()
    (base / "authorized_keys").write_text(user_key.public)

    def start(count: int = 1, *, time_scale: float = 0.001, **faults) -> list[SimNodeServer]:
        out = []
        for _ in range(count):
            name = f"node{len(started) + 1}"
            server = SimNodeServer(base / name, name, authorized_keys=base / "authorized_keys", time_scale=time_scale,
                                   fx_array=base / "fx-array")
            server.prepare()
            if faults:
                update_state(server.root, lambda state: state["faults"].update(faults))
            started.append(server.start())
            out.append(server)
        return out

    yield start
    for server in started:
        server.stop()


def set_faults(server: SimNodeServer, **faults) -> None:
    update_state(server.root, lambda state: state["faults"].update(faults))


@pytest.fixture
def pilot(db):
    from gates.models import Organisation, Pilot
    from runners.config import default_simulated

    suffix = uuid.uuid4().hex[:6]
    vendor = Organisation.objects.create(name=f"Vendor {suffix}", kind=Organisation.Kind.VENDOR)
    customer = Organisation.objects.create(name=f"Customer {suffix}", kind=Organisation.Kind.CUSTOMER)
    return Pilot.objects.create(name=f"Pilot {suffix}", vendor=vendor, customer=customer, deployment=default_simulated())


@pytest.fixture
def site(pilot):
    from runners.models import Site

    return Site.objects.create(pilot=pilot, name="Test site", queue=f"site-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def credential(site, user_key):
    from runners.credentials import create_credential

    return create_credential(site, "test key", user_key.text)


@pytest.fixture
def make_node(site, credential):
    """Factory: ``make_node(server_or_sshd, accept=True, **fields)`` → a Node (host key accepted unless accept=False)."""
    from runners.models import Node

    def make(target, *, accept: bool = True, name: str | None = None, **fields) -> Node:
        simulated = isinstance(target, SimNodeServer)
        values = {"host": "127.0.0.1", "port": target.port, "username": target.username, "credential": credential,
                  "simulated": simulated}
        values.update(fields)
        node = Node.objects.create(site=site, name=name or getattr(target, "name", "sshd"), **values)
        if accept:
            key = target.host_key
            Node.objects.filter(pk=node.pk).update(host_key_state=Node.HostKeyState.ACCEPTED, host_key_type=key.get_name(),
                                                   host_key=key.get_base64(), host_key_fingerprint=key.fingerprint)
            node.refresh_from_db()
        return node

    return make


@pytest.fixture
def job(pilot, site):
    from runners.models import Job

    return Job.objects.create(pilot=pilot, site=site, kind=Job.Kind.PROBE)


def job_text(job, stream: str | None = None) -> str:
    chunks = job.chunks.order_by("seq")
    if stream:
        chunks = chunks.filter(stream=stream)
    return "".join(c.text for c in chunks)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Sshd(SimpleNamespace):
    @property
    def host_key(self):
        import paramiko

        return paramiko.Ed25519Key.from_private_key_file(str(self.host_key_path))


@pytest.fixture(scope="session")
def sshd(tmp_path_factory, user_key):
    """OpenSSH's sshd on a loopback port with a generated host key, authorizing ``user_key`` for the current user."""
    if not os.path.exists(SSHD):
        pytest.skip("OpenSSH sshd is not installed (scripts/system-packages openssh-server)")
    folder = tmp_path_factory.mktemp("sshd")
    host_key = folder / "ssh_host_ed25519_key"
    generate_ed25519(host_key, comment="fxpilot-test-sshd")
    (folder / "authorized_keys").write_text(user_key.public)
    os.chmod(folder / "authorized_keys", 0o600)
    port = _free_port()
    config = folder / "sshd_config"
    config.write_text(
        f"ListenAddress 127.0.0.1:{port}\nHostKey {host_key}\nPidFile {folder / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
        "AllowTcpForwarding yes\nSubsystem sftp internal-sftp\nLogLevel ERROR\nMaxStartups 100\nMaxSessions 100\n"
        # What runs over this server (the real tier's vLLM, detached by deploy.sh) carries the session's mark and
        # so ends with the session (infra.lifetime.start_watcher): sshd gives its sessions a fresh environment.
        + "".join(f"SetEnv {name}={value}\n" for name, value in watched_environment().items())
    )
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"sshd cannot run here: {check.stderr.strip()}")
    # sshd writes its title over its environment, where the session's watcher looks for its mark: a death signal,
    # and its pid file for the watcher.
    watch_files(folder / "sshd.pid")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=die_with_parent())
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None:
                pytest.skip(f"sshd exited: {proc.stderr.read().decode()[-500:]}")
            time.sleep(0.05)
    yield Sshd(port=port, host_key_path=host_key, username=getpass.getuser(), folder=folder, name="sshd", pid=proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
