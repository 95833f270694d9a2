from __future__ import annotations

import pytest

from tests.storage.seaweed import SeaweedFS


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory):
    """One SeaweedFS for the whole test session (it takes a few seconds to start)."""
    # Its four ports are chosen free, then bound by weed a moment later: a parallel test session may take one in
    # between, and weed exits. A new set of ports, at most three times.
    for attempt in range(3):
        try:
            store = SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
            break
        except RuntimeError:
            if attempt == 2:
                raise
    yield store
    store.stop()


@pytest.fixture
def s3_evidence(settings, seaweedfs):
    """The evidence storage of this test process is the S3 store."""
    settings.STORAGES = {**settings.STORAGES, "evidence": seaweedfs.evidence_storage}
    return seaweedfs
