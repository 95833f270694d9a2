"""Shared fixtures: the demo people — alice (vendor engineer and lead), bob (customer approver),
carol (customer engineer) and charlie (approver of an unrelated customer) — and their pilot."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model


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
