"""Shared fixtures: the demo people — alice (vendor engineer and lead), bob (customer approver),
carol (customer engineer) and charlie (approver of an unrelated customer) — and their pilot."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model

# Directories whose session fixtures are costly and shared by several files (three whole demos; the real vLLM
# servers): under `make test`'s parallel sessions, each goes to one session whole, never started twice.
SHARED_SET_UP = {"demo", "real"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Group the tests for pytest-xdist's `--dist loadgroup`: a file at a time (a module's fixtures and its tests'
    order stay together), a whole directory for those in SHARED_SET_UP."""
    root = Path(__file__).resolve().parent
    for item in items:
        try:
            parts = Path(str(item.fspath)).resolve().relative_to(root).parts
        except ValueError:
            continue
        group = parts[0] if parts[0] in SHARED_SET_UP else "/".join(parts)
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _language_back_to_english():
    """A request in Chinese leaves its language active in the thread (Django's translation is per thread, and
    the test client serves requests in this one): every test starts, and leaves, in the default language."""
    from django.conf import settings
    from django.utils import translation

    translation.activate(settings.LANGUAGE_CODE)
    yield
    translation.activate(settings.LANGUAGE_CODE)


@pytest.fixture
def demo(db) -> SimpleNamespace:
    from gates.management.commands.seed_demo import DEMO_PASSWORD, seed

    pilot = seed()
    User = get_user_model()
    people = {u.username: u for u in User.objects.filter(username__in=["alice", "bob", "carol", "charlie"])}
    return SimpleNamespace(pilot=pilot, password=DEMO_PASSWORD, **people)


@pytest.fixture
def signed_pilot(demo) -> SimpleNamespace:
    """The demo pilot with its plan signed by both parties: G1 is open."""
    from gates import lifecycle

    version = demo.pilot.latest_plan
    lifecycle.sign_plan(version, demo.alice)
    lifecycle.sign_plan(version, demo.bob)
    demo.pilot.refresh_from_db()
    return demo
