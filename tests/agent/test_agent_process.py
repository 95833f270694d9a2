"""The site agent process (runners.agent) on its own: no control plane, a real OpenSSH sshd on loopback.

* its configuration: the five variables only, and a refusal, naming the variable, of every control-plane secret;
* its own key: made once (folder 0700, file 0600), reused after;
* it imports nothing of Django (a fresh interpreter says so), nor the Django side of runners;
* its SSH layer (runners.agent.nodes) against a real sshd: a pinned key, an unknown key (pending, with the key
  offered), another key (changed), a refused key, a closed port, a timeout, a non-zero exit, a put and a get with
  their hashes, a put whose hash does not match, a jump host, the cache of connections.
"""
from __future__ import annotations

import ast
import hashlib
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from infra.lifetime import watched_environment
from runners import sealing
from runners.agent import config as agent_config
from runners.agent.nodes import AgentError, Connections, NodeConnection, NodeSpec, Stopped, key_text, load_private_key
from runners.simnode.server import generate_ed25519
from tests.runners.conftest import sshd, user_key  # noqa: F401 — the real sshd and its authorised key

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "fxa_" + "S3cr3tT0kenNeverPrinted" * 2


def agent_env(tmp_path, **extra) -> dict:
    env = {**watched_environment(), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
           "FXPILOT_AGENT_URL": "http://127.0.0.1:9", "FXPILOT_AGENT_TOKEN": TOKEN,
           "FXPILOT_AGENT_STATE": str(tmp_path / "state")}
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def run_agent(env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runners.agent", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


# --- configuration ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(agent_config.FORBIDDEN))
def test_the_agent_refuses_to_start_with_a_control_plane_secret_and_names_it(tmp_path, name):
    out = run_agent(agent_env(tmp_path, **{name: "postgres://fxpilot:pw@db/fxpilot"}))
    assert out.returncode == 2, out
    assert "must not hold" in out.stderr and f"unset {name}" in out.stderr
    assert TOKEN not in out.stderr + out.stdout
    assert "pw@db" not in out.stderr + out.stdout
    assert not (tmp_path / "state").exists()  # refused before anything was made
    check = run_agent(agent_env(tmp_path, **{name: "x"}), "--check")
    assert check.returncode == 1 and f"unset {name}" in check.stderr


@pytest.mark.parametrize("missing", [agent_config.URL, agent_config.TOKEN, agent_config.STATE])
def test_a_missing_variable_is_named(tmp_path, missing):
    out = run_agent(agent_env(tmp_path, **{missing: None}))
    assert out.returncode == 2
    assert f"{missing} is not set" in out.stderr


@pytest.mark.parametrize(("name", "value", "says"), [
    ("FXPILOT_AGENT_URL", "ftp://cp.example", "http:// or https://"),
    ("FXPILOT_AGENT_URL", "https://user:pw@cp.example", "without a user name"),
    ("FXPILOT_AGENT_SLOTS", "many", "whole number"),
    ("FXPILOT_AGENT_SLOTS", "0", "between 1 and"),
    ("FXPILOT_AGENT_CA", "/nonexistent/ca.pem", "not a file"),
])
def test_a_wrong_value_is_explained(tmp_path, name, value, says):
    with pytest.raises(agent_config.ConfigError, match=name) as caught:
        agent_config.load(agent_env(tmp_path, **{name: value}))
    assert says in str(caught.value) and "pw" not in str(caught.value)


def test_the_configuration_is_read_from_the_five_variables(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    config = agent_config.load(agent_env(tmp_path, FXPILOT_AGENT_URL="https://cp.example/fx/", FXPILOT_AGENT_CA=str(ca),
                                         FXPILOT_AGENT_SLOTS="3"))
    assert (config.url, config.api, config.slots, config.ca) == ("https://cp.example/fx", "https://cp.example/fx/agent/v1",
                                                                 3, ca)
    assert TOKEN not in repr(config)
    assert not config.insecure_transport()
    assert agent_config.load(agent_env(tmp_path)).insecure_transport() is False  # loopback
    assert agent_config.load(agent_env(tmp_path, FXPILOT_AGENT_URL="http://cp.example")).insecure_transport()


def test_the_key_is_made_once_0600_in_a_0700_folder_and_reused(tmp_path):
    config = agent_config.load(agent_env(tmp_path))
    key, made = agent_config.load_or_make_key(config)
    assert made
    assert stat.S_IMODE(config.state.stat().st_mode) == 0o700
    assert stat.S_IMODE(config.key_path.stat().st_mode) == 0o600
    assert sorted(p.name for p in config.state.iterdir()) == ["agent.key"]  # no temporary file left
    again, made_again = agent_config.load_or_make_key(config)
    assert (again, made_again) == (key, False)
    assert sealing.open_sealed(again, sealing.seal(sealing.public_of(key), b"x")) == b"x"
    # A started agent (a process) finds the same key and says nothing of it but its fingerprint.
    out = run_agent(agent_env(tmp_path), "--check", timeout=600)
    assert out.returncode == 1 and "did not accept the hello" in out.stderr
    assert config.key_path.read_text().strip() == key
    assert key not in out.stdout + out.stderr and TOKEN not in out.stdout + out.stderr


def test_a_key_others_may_read_is_refused_and_a_loose_folder_is_tightened(tmp_path):
    config = agent_config.load(agent_env(tmp_path))
    agent_config.load_or_make_key(config)
    config.state.chmod(0o755)
    agent_config.load_or_make_key(config)
    assert stat.S_IMODE(config.state.stat().st_mode) == 0o700
    config.key_path.chmod(0o644)
    with pytest.raises(agent_config.ConfigError, match="chmod 600"):
        agent_config.load_or_make_key(config)


# --- nothing of Django ------------------------------------------------------------------------

NO_DJANGO = """
import sys
import runners.agent, runners.agent.main, runners.agent.nodes, runners.agent.client, runners.agent.config
django_side = ("runners.ssh", "runners.models", "runners.credentials", "runners.crypto", "fxpilot")
bad = sorted(m for m in sys.modules if m == "django" or m.startswith("django.") or m in django_side
             or m.startswith(tuple(name + "." for name in django_side)))
print("BAD:" + ",".join(bad))
"""


def test_the_agent_imports_neither_django_nor_the_django_side_of_runners(tmp_path):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)}  # no DJANGO_SETTINGS_MODULE
    out = subprocess.run([sys.executable, "-c", NO_DJANGO], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "BAD:"


def test_every_import_of_the_agent_package_is_the_standard_library_its_few_libraries_or_sealing():
    allowed_roots = set(sys.stdlib_module_names) | {"paramiko", "cryptography", "nacl"}
    found = []
    for path in sorted((ROOT / "runners" / "agent").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] if node.module != "runners" else [f"runners.{a.name}" for a in node.names]
            for name in names:
                root = name.split(".")[0]
                ok = (root in allowed_roots or name in ("runners.sealing", "runners.sshparts")
                      or name.startswith("runners.agent"))
                if not ok:
                    found.append(f"{path.name}: {name}")
    assert found == []


# --- private keys -----------------------------------------------------------------------------

def _keys():
    return {"ed25519": ed25519.Ed25519PrivateKey.generate(), "ecdsa": ec.generate_private_key(ec.SECP256R1()),
            "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048)}


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa", "rsa"])
def test_private_keys_are_read_in_openssh_and_pem_with_and_without_a_passphrase(kind):
    key = _keys()[kind]
    want = {"ed25519": paramiko.Ed25519Key, "ecdsa": paramiko.ECDSAKey, "rsa": paramiko.RSAKey}[kind]
    formats = [serialization.PrivateFormat.OpenSSH, serialization.PrivateFormat.PKCS8]
    if kind != "ed25519":
        formats.append(serialization.PrivateFormat.TraditionalOpenSSL)
    for fmt in formats:
        plain = key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())
        locked = key.private_bytes(serialization.Encoding.PEM, fmt, serialization.BestAvailableEncryption(b"pass word"))
        assert isinstance(load_private_key(plain), want)
        assert isinstance(load_private_key(locked, "pass word"), want)
        with pytest.raises(ValueError, match="encrypted and no passphrase"):
            load_private_key(locked)
        with pytest.raises(ValueError, match="not encrypted"):
            load_private_key(plain, "pass word")
        with pytest.raises(ValueError):
            load_private_key(locked, "wrong")
    with pytest.raises(ValueError, match="not a private key"):
        load_private_key(b"ssh-ed25519 AAAA fxpilot")


# --- SSH against a real sshd ------------------------------------------------------------------

@pytest.fixture(scope="module")
def agent_key():
    return sealing.new_keypair()[0]


@pytest.fixture
def spec_for(sshd, user_key, agent_key):  # noqa: F811 — the fixtures imported above
    public = sealing.public_of(agent_key)

    def make(host_key="pinned", *, key_text_=None, passphrase="", **fields) -> NodeSpec:
        data = {"name": "sshd", "host": "127.0.0.1", "port": sshd.port, "username": sshd.username,
                "host_key": key_text(sshd.host_key) if host_key == "pinned" else host_key,
                "sealed_key": sealing.seal(public, (key_text_ or user_key.text).encode()),
                "sealed_passphrase": sealing.seal(public, passphrase.encode()) if passphrase else "", "jump": None}
        data.update(fields)
        return NodeSpec.parse(data)

    return make


def connect(spec: NodeSpec, agent_key: str) -> NodeConnection:
    return NodeConnection(spec, agent_key).open()


def failure(spec: NodeSpec, agent_key: str) -> AgentError:
    with pytest.raises(AgentError) as caught:
        connect(spec, agent_key).close()
    return caught.value


def test_a_run_with_the_pinned_key_streams_its_output_and_reports_a_non_zero_exit(spec_for, agent_key):
    seen = []
    with connect(spec_for(), agent_key) as conn:
        code = conn.run("echo out-1; echo err-1 >&2; printf 'out-2'; exit 3", timeout=600,
                        output=lambda stream, data: seen.append((stream, data)))
        assert code == 3
        assert b"".join(d for s, d in seen if s == "stdout") == b"out-1\nout-2"
        assert b"".join(d for s, d in seen if s == "stderr") == b"err-1\n"
        assert conn.run("true") == 0


def test_an_unknown_host_key_is_pending_with_the_key_offered_and_nothing_is_accepted(spec_for, agent_key, sshd):  # noqa: F811
    exc = failure(spec_for(host_key=None), agent_key)
    assert exc.kind == "host-key-pending"
    assert exc.offered_key == key_text(sshd.host_key)
    assert sshd.host_key.fingerprint in str(exc)
    assert exc.report()["error"] == {"kind": "host-key-pending", "message": str(exc), "offered_key": exc.offered_key,
                                     "node": "sshd"}
    assert failure(spec_for(host_key=None), agent_key).kind == "host-key-pending"  # still not accepted


def test_another_host_key_than_the_pinned_one_is_changed(spec_for, agent_key, sshd, tmp_path):  # noqa: F811
    other = generate_ed25519(tmp_path / "other_host_key")
    exc = failure(spec_for(host_key=key_text(other)), agent_key)
    assert exc.kind == "host-key-changed"
    assert exc.offered_key == key_text(sshd.host_key)
    assert other.fingerprint in str(exc) and sshd.host_key.fingerprint in str(exc)
    # A pinned key of another type: the node's own key is still refused.
    ecdsa_key = paramiko.ECDSAKey.generate()
    assert failure(spec_for(host_key=key_text(ecdsa_key)), agent_key).kind == "host-key-changed"


def test_a_refused_key_a_closed_port_a_foreign_seal_and_bad_settings_are_classified(spec_for, agent_key, tmp_path):
    stranger = generate_ed25519(tmp_path / "stranger")
    exc = failure(spec_for(key_text_=(tmp_path / "stranger").read_text()), agent_key)
    assert exc.kind == "auth" and stranger.fingerprint in str(exc)
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    assert failure(spec_for(port=closed), agent_key).kind == "unreachable"
    other_agent = sealing.new_keypair()[0]
    exc = failure(spec_for(), other_agent)
    assert exc.kind == "invalid" and "cannot open the node's key" in str(exc)
    assert failure(spec_for(host="no-such-host.invalid"), agent_key).kind in ("invalid", "unreachable")
    for fields in ({"port": 70000}, {"username": "-x"}, {"host": "a b"}, {"host_key": "ssh-ed25519 !!!"}):
        with pytest.raises(AgentError) as caught:
            spec_for(**fields)
        assert caught.value.kind == "invalid"


def test_an_encrypted_key_is_opened_with_its_sealed_passphrase(spec_for, agent_key, user_key):  # noqa: F811
    loaded = serialization.load_ssh_private_key(user_key.text.encode(), password=None)
    locked = loaded.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                  serialization.BestAvailableEncryption(b"open sesame")).decode()
    with connect(spec_for(key_text_=locked, passphrase="open sesame"), agent_key) as conn:
        assert conn.run("true") == 0
    assert failure(spec_for(key_text_=locked), agent_key).kind == "invalid"


def test_a_command_past_its_timeout_is_stopped_and_reported_as_a_timeout(spec_for, agent_key):
    with connect(spec_for(), agent_key) as conn:
        started = time.monotonic()
        with pytest.raises(AgentError) as caught:
            conn.run("sleep 900", timeout=0.5)
        assert caught.value.kind == "timeout"
        # not the sleep's end: a bound only a command that ran on past its limit reaches, however loaded the machine
        assert time.monotonic() - started < 600, "the 0.5 s limit did not stop `sleep 900`"
        assert conn.run("true") == 0  # the connection stays usable


def test_a_command_is_stopped_when_the_control_plane_says_so(spec_for, agent_key):
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with connect(spec_for(), agent_key) as conn:
        started = time.monotonic()
        with pytest.raises(Stopped):
            conn.run("sleep 900", stop=stop)
        assert time.monotonic() - started < 600, "the stop did not end `sleep 900`"


class _Reader:
    def __init__(self, data: bytes, piece: int = 1000) -> None:
        self.data, self.piece, self.pos = data, piece, 0

    def read(self, size: int = -1) -> bytes:
        chunk = self.data[self.pos:self.pos + min(size, self.piece)]
        self.pos += len(chunk)
        return chunk


def test_a_put_writes_a_part_compares_the_nodes_hash_sets_the_mode_and_renames(spec_for, agent_key, tmp_path):
    data = os.urandom(300_000)
    digest = hashlib.sha256(data).hexdigest()
    target = tmp_path / "put" / "script.sh"
    target.parent.mkdir()
    with connect(spec_for(), agent_key) as conn:
        assert conn.put(_Reader(data, 7777), str(target), sha256=digest, mode=0o750, size=len(data)) == digest
    assert target.read_bytes() == data
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert not Path(str(target) + ".part").exists()


def test_a_put_whose_hash_does_not_match_is_io_and_leaves_no_part(spec_for, agent_key, tmp_path):
    target = tmp_path / "mismatch.bin"
    with connect(spec_for(), agent_key) as conn:
        with pytest.raises(AgentError) as caught:
            conn.put(_Reader(b"what arrived"), str(target), sha256=hashlib.sha256(b"what was meant").hexdigest())
    assert caught.value.kind == "io" and "corrupted" in str(caught.value)
    assert not target.exists() and not Path(str(target) + ".part").exists()


def test_a_put_whose_payload_breaks_off_leaves_no_part(spec_for, agent_key, tmp_path):
    class Broken(_Reader):
        def read(self, size=-1):
            if self.pos:
                raise ConnectionResetError("the control plane went away")
            return super().read(size)

    target = tmp_path / "broken.bin"
    with connect(spec_for(), agent_key) as conn:
        with pytest.raises(ConnectionResetError):
            conn.put(Broken(b"x" * 5000), str(target), sha256="0" * 64)
    assert not Path(str(target) + ".part").exists()


def test_a_get_streams_the_file_with_its_size_and_a_missing_file_is_io(spec_for, agent_key, tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 17)
    source = tmp_path / "result.bin"
    source.write_bytes(data)
    with connect(spec_for(), agent_key) as conn:
        with conn.reader(str(source)) as remote:
            assert remote.size == len(data)
            received = hashlib.sha256()
            pieces = 0
            while chunk := remote.read(256 * 1024):
                received.update(chunk)
                pieces += 1
        assert received.hexdigest() == hashlib.sha256(data).hexdigest() == conn.sha256(str(source))
        assert pieces > 1
        with pytest.raises(AgentError) as caught:
            with conn.reader(str(tmp_path / "absent")):
                pass
        assert caught.value.kind == "io"


def test_a_node_behind_a_jump_host_is_reached_through_a_direct_tcpip_channel(spec_for, agent_key, sshd):  # noqa: F811
    jump = spec_for()
    behind = spec_for(name="behind", jump={"name": "jump", "host": "127.0.0.1", "port": sshd.port,
                                           "username": sshd.username, "host_key": jump.host_key,
                                           "sealed_key": jump.sealed_key})
    with connect(behind, agent_key) as conn:
        assert conn.run("true") == 0
        assert conn._jump is not None and conn._jump.alive()
    exc = failure(spec_for(name="behind", jump={"name": "jump", "host": "127.0.0.1", "port": sshd.port,
                                                  "username": sshd.username, "host_key": None,
                                                  "sealed_key": jump.sealed_key}), agent_key)
    assert exc.kind == "host-key-pending" and exc.node == "jump"


def test_connections_are_cached_per_spec_replaced_once_when_dead_and_closed_when_idle(spec_for, agent_key):
    cache = Connections(agent_key, idle=60)
    spec = spec_for()
    first = cache.call(spec, lambda conn: conn)
    assert cache.call(spec, lambda conn: conn) is first and len(cache) == 1
    # Another host key or another (sealed) key is another connection.
    assert spec_for(host_key=None).cache_key != spec.cache_key
    assert spec_for(sealed_key=spec.sealed_key).cache_key == spec.cache_key != spec_for().cache_key
    # The connection dies under the cache: the next call opens a fresh one.
    first.transport.close()
    second = cache.call(spec, lambda conn: conn.run("true") == 0 and conn)
    assert second is not first and second.alive()
    # Dead without the cache knowing (it still looks alive): the session cannot open, a fresh connection is tried once.
    tries = []

    def work(conn):
        tries.append(conn)
        if len(tries) == 1:
            raise AgentError("connection-lost", "cannot open a session", before_start=True)
        return conn.run("echo ok")

    assert cache.call(spec, work) == 0 and len(tries) == 2 and tries[1] is not tries[0]
    # Lost while working (not before): reported, never run twice.
    tries.clear()

    def lost(conn):
        tries.append(conn)
        raise AgentError("connection-lost", "connection lost during `x`")

    with pytest.raises(AgentError):
        cache.call(spec, lost)
    assert len(tries) == 1 and len(cache) == 0  # a connection that lost a command is not kept
    assert cache.call(spec, lambda conn: conn.run("true")) == 0 and len(cache) == 1
    assert cache.reap() == 0  # used just now
    cache.idle = 0
    assert cache.reap() == 1 and len(cache) == 0
    cache.close_all()
