"""Validators of everything that reaches a remote shell."""
from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from runners.validators import validate_host, validate_nqn, validate_port, validate_remote_path, validate_username


@pytest.mark.parametrize("value", ["gpu-01", "gpu01.example.com", "10.0.0.7", "::1", "fe80::1", "a" * 63 + ".example"])
def test_it_accepts_host_names_and_ip_addresses(value):
    assert validate_host(value) == value


@pytest.mark.parametrize("value", ["", "-gpu", "gpu_01", "a b", "gpu;reboot", "$(id)", "1.2.3.4.5", "a" * 64, "x" * 254])
def test_it_refuses_what_is_neither_a_host_name_nor_an_ip(value):
    with pytest.raises(ValidationError, match="neither an IP address nor a host name"):
        validate_host(value)


@pytest.mark.parametrize("value, ok", [(1, True), (65535, True), ("22", True), (0, False), (65536, False), ("x", False)])
def test_ports_must_be_within_1_to_65535(value, ok):
    if ok:
        assert validate_port(value) == int(value)
    else:
        with pytest.raises(ValidationError):
            validate_port(value)


@pytest.mark.parametrize("value, ok", [("fxpilot", True), ("_svc", True), ("a.b-c", True), ("root", True),
                                       ("1abc", False), ("-x", False), ("a b", False), ("a;b", False), ("a" * 33, False)])
def test_user_names_follow_the_posix_pattern(value, ok):
    if ok:
        assert validate_username(value) == value
    else:
        with pytest.raises(ValidationError):
            validate_username(value)


@pytest.mark.parametrize("value", ["", "/a\x00b", "/a\nb", "/a\rb"])
def test_remote_paths_hold_no_nul_or_line_break(value):
    with pytest.raises(ValidationError):
        validate_remote_path(value)


def test_nqns_follow_the_nvme_grammar():
    assert validate_nqn("nqn.2026-01.com.example.fx:fx100.pool0")
    with pytest.raises(ValidationError):
        validate_nqn("iqn.2026-01.com.example:x")
