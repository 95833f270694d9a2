"""Bad input is refused at the door, saying what was wrong: hosts, vLLM flags, keys, files, traces."""
from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from gates.models import AuditEvent
from runners.config import DeploymentSettingsError, default_simulated, validate_deployment
from runners.credentials import load_private_key
from runners.validators import validate_host


@pytest.mark.parametrize("value", ["fe80::1%eth0;id", "::1%-oProxyCommand=x", "fe80::1%eth0 x", "fe80::1%$(id)",
                                   "fe80::1%" + "a" * 16, "10.0.0.1;id", "host name", "-oProxyCommand=x"])
def test_a_host_with_anything_but_an_interface_after_the_scope_is_refused(value):
    with pytest.raises(ValidationError) as error:
        validate_host(value)
    assert value.strip() in " ".join(error.value.messages)


@pytest.mark.parametrize("value", ["fe80::1%eth0", "fe80::1%2", "fe80::1%enp1s0f0", "fe80::1%br-lan", "10.1.2.3",
                                   "gpu-01.lab.example", "::1"])
def test_ordinary_hosts_and_scoped_addresses_pass(value):
    assert validate_host(value) == value


@pytest.mark.parametrize("flags", [["--trust-remote-code"], ["--allowed-local-media-path=/"],
                                   ["--allowed-local-media-path", "/"], ["--trust-remote"], ["--config=/etc/x.yaml"],
                                   ["--middleware", "evil.Mod"], ["--api-key=s3cret"]])
def test_dangerous_vllm_flags_are_refused_naming_the_flag(flags):
    settings = default_simulated()
    settings["extra_vllm_flags"] = flags
    with pytest.raises(DeploymentSettingsError) as error:
        validate_deployment(settings)
    assert "extra_vllm_flags[0]" in str(error.value) and flags[0].split("=")[0] in str(error.value)


def test_harmless_vllm_flags_still_pass():
    settings = default_simulated()
    settings["extra_vllm_flags"] = ["--max-num-seqs", "64", "--enable-chunked-prefill", "--no-trust-remote-code"]
    assert validate_deployment(settings).extra_vllm_flags[:2] == ("--max-num-seqs", "64")


def _ed25519(fmt, encryption) -> str:
    key = ed25519.Ed25519PrivateKey.generate()
    return key.private_bytes(serialization.Encoding.PEM, fmt, encryption).decode()


def test_an_unencrypted_key_with_a_passphrase_is_told_it_needs_none():
    text = _ed25519(serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    with pytest.raises(ValidationError, match="not encrypted; leave the passphrase empty"):
        load_private_key(text, "a passphrase")
    assert load_private_key(text).get_name() == "ssh-ed25519"


def test_an_encrypted_pkcs8_ed25519_key_opens_with_its_passphrase():
    text = _ed25519(serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"right horse"))
    assert "ENCRYPTED PRIVATE KEY" in text
    assert load_private_key(text, "right horse").get_name() == "ssh-ed25519"
    with pytest.raises(ValidationError, match="passphrase does not open"):
        load_private_key(text, "wrong")
    with pytest.raises(ValidationError, match="encrypted; enter its passphrase"):
        load_private_key(text)


def test_a_deployment_file_that_is_not_utf8_is_refused_naming_the_byte(demo, tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_bytes("model: qwen\nnote: caf\xe9\n".encode("latin-1"))
    with pytest.raises(CommandError, match=r"not UTF-8 text \(byte 21 is 0xe9\)"):
        call_command("deployment", demo.pilot.name, "--set", str(path), "--check")


def test_a_trace_over_the_limit_is_refused_before_it_is_read(signed_pilot, tmp_path, settings):
    settings.FXPILOT_TRACE_MAX_BYTES = 1024
    path = tmp_path / "trace.csv"
    path.write_bytes(b"session,turn,prompt_tokens,output_tokens\n" + b"s1,1,100,10\n" * 200)
    with pytest.raises(CommandError, match="largest accepted is 1024 bytes"):
        call_command("run_gate", signed_pilot.pilot.name, "G1", "--trace", str(path))


def test_a_host_key_accepted_by_the_command_leaves_an_audit_event(world):
    node = world.node
    call_command("accept_host_key", str(node.code), node.pending_host_key_fingerprint)
    event = AuditEvent.objects.get(action="node.host_key_accepted", object_id=str(node.pk))
    assert event.pilot_id == world.pilot.pk and event.actor_label.startswith("command line (")
    node.refresh_from_db()
    assert node.host_key_accepted_by is None and node.host_key_accepted_label == event.actor_label
    assert event.detail["fingerprint"] == "SHA256:examplefingerprint"


def test_a_trace_over_the_limit_is_refused_by_the_run_itself(settings):
    from runners.runs import RunRefused, check_trace

    settings.FXPILOT_TRACE_MAX_BYTES = 100
    with pytest.raises(RunRefused, match="largest accepted is 100 bytes"):
        check_trace(b"session,turn,prompt_tokens,output_tokens\n" + b"s1,1,100,10\n" * 20)
