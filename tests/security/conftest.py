"""Security tests reuse the portal's world: a signed pilot with a site, a node, a run, an artifact and a report."""
from __future__ import annotations

import pytest

from tests.portal.conftest import build_world


@pytest.fixture
def world(demo):
    return build_world(demo)
