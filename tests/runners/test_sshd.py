"""The same SSH layer against OpenSSH's sshd (started by the tests on a loopback port)."""
from __future__ import annotations

import time

import paramiko
import pytest

from runners import detached, ssh
from runners.artifacts import read_artifact
from runners.models import Node
from tests.runners.conftest import job_text


def test_first_contact_with_sshd_waits_for_acceptance(sshd, make_node):
    node = make_node(sshd, accept=False)
    with pytest.raises(ssh.HostKeyPending):
        ssh.run(node, "true")
    node.refresh_from_db()
    assert node.pending_host_key_fingerprint == sshd.host_key.fingerprint
    ssh.accept_host_key(node, sshd.host_key.fingerprint)
    assert ssh.run(node, "echo $((6 * 7))").stdout == "42\n"


def test_sshd_offering_another_key_than_the_pinned_one_is_refused(sshd, make_node):
    node = make_node(sshd)
    Node.objects.filter(pk=node.pk).update(host_key_type=sshd.host_key.get_name(), host_key=_other_ed25519(),
                                           host_key_fingerprint="SHA256:pinned-but-wrong")
    node.refresh_from_db()
    with pytest.raises(ssh.HostKeyChanged) as caught:
        ssh.run(node, "true")
    assert caught.value.offered == sshd.host_key.fingerprint and caught.value.expected == "SHA256:pinned-but-wrong"


def _other_ed25519() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    raw = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                                          serialization.PublicFormat.OpenSSH)
    return raw.decode().split()[1]


def test_sshd_refuses_a_key_it_does_not_know(sshd, make_node, site):
    from runners.credentials import create_credential

    stranger = paramiko.RSAKey.generate(2048)
    import io
    buf = io.StringIO()
    stranger.write_private_key(buf)
    node = make_node(sshd, credential=create_credential(site, "stranger", buf.getvalue()))
    with pytest.raises(ssh.AuthenticationFailed):
        ssh.run(node, "true")


def test_sshd_streams_output_and_reports_exit_codes(sshd, make_node, job):
    node = make_node(sshd)
    with ssh.connect(node) as conn:
        assert conn.run("printf 'a\\nb\\n'; printf 'warn\\n' >&2", job=job).stdout == "a\nb\n"
        with pytest.raises(ssh.CommandFailed) as caught:
            conn.run("echo no >&2; exit 3", job=job)
    assert caught.value.exit_code == 3 and caught.value.stderr_tail == "no\n"
    assert job_text(job, "stdout") == "a\nb\n" and "warn\nno\n" == job_text(job, "stderr")


def test_sshd_transfers_are_hashed_on_both_ends(sshd, make_node, job, tmp_path):
    node = make_node(sshd)
    remote = str(tmp_path / "remote" / "blob.bin")
    data = bytes(range(256)) * 500
    with ssh.connect(node) as conn:
        conn.mkdirs(str(tmp_path / "remote"))
        digest = conn.upload(data, remote)
        artifact = conn.download(remote, job=job, name="sshd/blob.bin", kind="test")
    assert (tmp_path / "remote" / "blob.bin").read_bytes() == data
    assert artifact.sha256 == digest and read_artifact(artifact) == data and not artifact.simulated


def test_a_detached_command_on_sshd_survives_the_session_and_cancel_leaves_nothing(sshd, make_node, job, tmp_path):
    node = make_node(sshd)
    run_dir = str(tmp_path / "detached")
    proc = detached.start(node, run_dir, "echo started; sleep 300 & sleep 300 & wait")
    time.sleep(0.3)
    status = detached.poll(node, proc.to_dict(), job=job)
    assert status.running and status.stdout == "started\n"
    result = detached.cancel(node, status.proc, grace_seconds=2)
    assert result.signalled and result.left == []
    left = ssh.run(node, f"ps -eo pgid=,stat= | awk '$1 == {proc.pgid} && $2 !~ /^Z/' | wc -l").stdout.strip()
    assert left == "0"
    assert detached.poll(node, status.proc).state == "canceled"


def test_a_jump_host_carries_the_connection_to_the_node(sshd, simnodes, make_node):
    jump = make_node(sshd, name="jump", role=Node.Role.JUMP)
    target = make_node(simnodes(1)[0], jump_host=jump)
    assert ssh.run(target, "echo $FXPILOT_SIM_NODE").stdout == "node1\n"
