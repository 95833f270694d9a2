"""The SSH layer against simulated nodes over real SSH: host keys, auth, streaming, failures, transfers."""
from __future__ import annotations

import socket
import threading

import pytest

from runners import ssh
from runners.artifacts import read_artifact
from runners.models import Node
from tests.runners.conftest import job_text, set_faults

ROOMY = ssh.Timeouts(connect=10, banner=10, auth=10, channel=10, keepalive=5)


def test_first_contact_records_the_offered_key_and_stops(simnodes, make_node):
    server = simnodes(1)[0]
    node = make_node(server, accept=False)
    with pytest.raises(ssh.HostKeyPending) as caught:
        ssh.run(node, "true")
    node.refresh_from_db()
    assert node.host_key_state == Node.HostKeyState.PENDING
    assert node.pending_host_key_fingerprint == server.fingerprint == caught.value.fingerprint
    assert not caught.value.transient


def test_an_accepted_key_lets_commands_run(simnodes, make_node):
    server = simnodes(1)[0]
    node = make_node(server, accept=False)
    with pytest.raises(ssh.HostKeyPending):
        ssh.run(node, "true")
    node.refresh_from_db()
    with pytest.raises(ValueError, match="not SHA256:wrong"):
        ssh.accept_host_key(node, "SHA256:wrong")
    ssh.accept_host_key(node, server.fingerprint)
    assert node.host_key_state == Node.HostKeyState.ACCEPTED
    assert ssh.run(node, "echo hello").stdout == "hello\n"


def test_it_refuses_a_changed_host_key_and_shows_both_fingerprints(simnodes, make_node):
    server = simnodes(1)[0]
    node = make_node(server)
    old = server.fingerprint
    new = server.rekey()
    with pytest.raises(ssh.HostKeyChanged) as caught:
        ssh.run(node, "true")
    assert caught.value.expected == old and caught.value.offered == new
    assert old in str(caught.value) and new in str(caught.value)
    assert not ssh.is_transient(caught.value)
    node.refresh_from_db()
    assert node.host_key_state == Node.HostKeyState.ACCEPTED and node.host_key_fingerprint == old
    assert node.pending_host_key_fingerprint == new


def test_a_refused_login_is_a_permanent_error(simnodes, make_node):
    server = simnodes(1, refuse_auth=True)[0]
    node = make_node(server)
    with pytest.raises(ssh.AuthenticationFailed) as caught:
        ssh.run(node, "true")
    assert not caught.value.transient
    assert "authentication refused" in str(caught.value) and node.name in str(caught.value)


def test_output_streams_into_the_job_and_the_exit_code_is_checked(simnodes, make_node, job):
    node = make_node(simnodes(1)[0])
    with ssh.connect(node) as conn:
        result = conn.run("for i in 1 2 3; do echo line $i; sleep 0.05; done; echo oops >&2", job=job)
        assert result.exit_code == 0 and result.stdout_tail == "line 1\nline 2\nline 3\n"
        with pytest.raises(ssh.CommandFailed) as caught:
            conn.run("echo partial; echo 'disk on fire' >&2; exit 7", job=job)
    assert caught.value.exit_code == 7 and "disk on fire" in caught.value.stderr_tail
    assert "exited with code 7" in str(caught.value) and not caught.value.transient
    assert "line 1\nline 2\nline 3\n" in job_text(job, "stdout") and "disk on fire" in job_text(job, "stderr")
    seqs = list(job.chunks.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def test_a_dropped_connection_keeps_the_output_received_so_far(simnodes, make_node, job):
    server = simnodes(1)[0]
    node = make_node(server)
    set_faults(server, drop_ssh_after_seconds=1.0)
    with pytest.raises(ssh.ConnectionLost) as caught:
        ssh.run(node, "echo before-the-drop; sleep 30; echo never", job=job, timeouts=ROOMY)
    assert caught.value.transient
    assert caught.value.result.stdout_tail == "before-the-drop\n"
    assert job_text(job, "stdout") == "before-the-drop\n"


def test_a_command_past_its_time_limit_is_stopped_with_its_output_kept(simnodes, make_node, job):
    node = make_node(simnodes(1)[0])
    with pytest.raises(ssh.CommandTimeout) as caught:
        ssh.run(node, "echo started; sleep 30", job=job, timeout=10)
    assert caught.value.result.stdout_tail == "started\n" and caught.value.transient


def test_a_node_that_never_sends_a_banner_times_out(make_node, simnodes):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    held = []
    threading.Thread(target=lambda: held.append(silent.accept()), daemon=True).start()
    server = simnodes(1)[0]
    node = make_node(server, port=silent.getsockname()[1])
    try:
        with pytest.raises(ssh.Unreachable) as caught:
            ssh.run(node, "true", timeouts=ssh.Timeouts(connect=2, banner=0.5, auth=1, channel=1))
        assert caught.value.transient
    finally:
        silent.close()


def test_an_unreachable_node_is_a_transient_error(simnodes, make_node):
    server = simnodes(1)[0]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    node = make_node(server, port=closed_port)
    with pytest.raises(ssh.Unreachable) as caught:
        ssh.run(node, "true", timeouts=ROOMY)
    assert caught.value.transient and "cannot connect" in str(caught.value)


def test_bad_node_settings_never_reach_the_network(simnodes, make_node):
    node = make_node(simnodes(1)[0], host="bad host;rm -rf /")
    with pytest.raises(ssh.InvalidNodeSettings, match="neither an IP address nor a host name"):
        ssh.run(node, "true")


def test_files_go_up_and_come_back_hashed_on_both_ends(simnodes, make_node, job, tmp_path):
    server = simnodes(1)[0]
    node = make_node(server)
    payload = b"x" * 100_000 + "é\n".encode()
    with ssh.connect(node) as conn:
        conn.mkdirs("~/up/dir with space", "~/up/it's; $(two)")  # several folders, one command, each quoted
        assert (server.root / "up" / "it's; $(two)").is_dir()
        digest = conn.upload(payload, "~/up/dir with space/file.bin", mode=0o640)
        assert (server.root / "up" / "dir with space" / "file.bin").read_bytes() == payload
        assert not (server.root / "up" / "dir with space" / "file.bin.part").exists()
        assert conn.remote_sha256(f"{server.root}/up/dir with space/file.bin") == digest
        artifact = conn.download("~/up/dir with space/file.bin", job=job, name="node1/file.bin", kind="test")
    assert artifact.sha256 == digest and read_artifact(artifact) == payload and artifact.simulated


def test_a_transfer_whose_hash_does_not_match_is_refused(simnodes, make_node, job):
    server = simnodes(1)[0]
    node = make_node(server)
    (server.root / "evidence.txt").write_text("the real bytes\n")
    set_faults(server, corrupt_transfers=True)
    with ssh.connect(node) as conn:
        with pytest.raises(ssh.TransferMismatch, match="upload of ~/sent.txt corrupted"):
            conn.upload(b"hello node\n", "~/sent.txt")
        with pytest.raises(ssh.TransferMismatch, match="download of ~/evidence.txt corrupted"):
            conn.download("~/evidence.txt", job=job, name="node1/evidence.txt", kind="test")
    assert not (server.root / "sent.txt").exists() and not (server.root / "sent.txt.part").exists()
    assert not job.artifacts.exists()


def test_every_value_in_a_path_is_quoted():
    assert ssh.shell_path("~/a b/$(reboot)") == "\"$HOME\"/'a b/$(reboot)'"
    assert ssh.shell_path("/x;y") == "'/x;y'"
    with pytest.raises(Exception, match="NUL or line break"):
        ssh.shell_path("/tmp/a\nreboot")


@pytest.mark.django_db(transaction=True)
def test_many_connections_are_served_at_once(simnodes, make_node):
    node = make_node(simnodes(1)[0])
    results, errors = [], []

    def one(i: int) -> None:
        try:
            results.append(ssh.run(node, f"sleep 0.2; echo {i}").stdout.strip())
        except Exception as exc:  # noqa: BLE001 — collected and asserted below
            errors.append(exc)

    from django.db import connection
    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    connection.close()
    assert not errors and sorted(results, key=int) == [str(i) for i in range(8)]


def test_a_slow_node_runs_into_the_command_time_limit(simnodes, make_node):
    node = make_node(simnodes(1, slow_command_seconds=2)[0])
    with pytest.raises(ssh.CommandTimeout):
        ssh.run(node, "echo late", timeout=0.5)


def test_a_passphrase_protected_key_from_the_store_logs_in(simnodes, make_node, site, tmp_path):
    import subprocess

    from runners.credentials import create_credential

    server = simnodes(1)[0]
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "open sesame", "-f", str(tmp_path / "k")], check=True)
    with open(server.authorized_keys, "a") as handle:
        handle.write((tmp_path / "k.pub").read_text())
    credential = create_credential(site, "locked", (tmp_path / "k").read_text(), "open sesame")
    assert ssh.run(make_node(server, credential=credential), "whoami >/dev/null; echo in").stdout == "in\n"
