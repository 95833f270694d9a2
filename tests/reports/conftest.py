"""Signing material made once per test session: the vendor's CA and an unrelated one."""
from __future__ import annotations

from pathlib import Path

import pytest

from reports import sign


@pytest.fixture(scope="session")
def ca(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ca")
    sign.setup_authority(folder, organisation="FX Storage")
    return folder


@pytest.fixture(scope="session")
def other_ca(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("other-ca")
    sign.setup_authority(folder, organisation="Someone Else")
    return folder


@pytest.fixture(scope="session")
def vendor_signer(ca):
    return sign.load_signer(ca / "signer-key.pem", ca / "signer-cert.pem", [ca / "root-cert.pem"])
