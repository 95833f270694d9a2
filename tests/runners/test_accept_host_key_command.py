"""manage.py accept_host_key: record on first contact, show, accept only the confirmed fingerprint."""
from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from runners.models import Node


def test_an_engineer_scans_compares_and_accepts_a_host_key(simnodes, make_node):
    server = simnodes(1)[0]
    node = make_node(server, accept=False)
    out = io.StringIO()
    call_command("accept_host_key", str(node.code), scan=True, stdout=out)
    assert server.fingerprint in out.getvalue() and "not accepted yet" in out.getvalue()
    with pytest.raises(CommandError, match="the waiting key is"):
        call_command("accept_host_key", str(node.code), "SHA256:somethingelse")
    call_command("accept_host_key", str(node.code), server.fingerprint, stdout=out)
    node.refresh_from_db()
    assert node.host_key_state == Node.HostKeyState.ACCEPTED and node.host_key_fingerprint == server.fingerprint
    out = io.StringIO()
    call_command("accept_host_key", str(node.code), scan=True, stdout=out)
    assert "still matches" in out.getvalue()


def test_an_unknown_node_code_is_named(db):
    with pytest.raises(CommandError, match="no node matches .nope."):
        call_command("accept_host_key", "nope")
