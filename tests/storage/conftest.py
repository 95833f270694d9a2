from __future__ import annotations

import pytest

from tests.storage.seaweed import SeaweedFS


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory):
    """One SeaweedFS for the whole test session (it takes a few seconds to start)."""
    store = SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
    yield store
    store.stop()


@pytest.fixture
def s3_evidence(settings, seaweedfs):
    """The evidence storage of this test process is the S3 store."""
    settings.STORAGES = {**settings.STORAGES, "evidence": seaweedfs.evidence_storage}
    return seaweedfs
