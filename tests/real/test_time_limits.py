"""The tier's time limits agree: pytest's timeout of each test of the tier outlasts every wait the tier makes on
the way (the numbers live in tests/real/conftest.py; docs/real-engine.md says them). Needs no engine."""
from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import SimpleNamespace

from tests.real.conftest import (
    ENGINE_BUILD_S,
    HEALTH_WAIT_S,
    MODEL_BUILD_S,
    TEST_TIMEOUT_S,
    WORKLOAD_S,
    real_deployment,
)

REPO = Path(__file__).resolve().parents[2]


def test_each_test_of_the_tier_may_last_longer_than_every_wait_of_the_tier(request):
    assert TEST_TIMEOUT_S > ENGINE_BUILD_S + MODEL_BUILD_S + HEALTH_WAIT_S + WORKLOAD_S
    # The timer pytest-timeout armed for this very test: SIGALRM's (its signal method, in the main thread) or its
    # thread's (the thread method).
    remaining = signal.getitimer(signal.ITIMER_REAL)[0]
    if not remaining:
        timers = [t for t in threading.enumerate() if isinstance(t, threading.Timer) and request.node.nodeid in t.name]
        remaining = timers[0].interval if timers else 0
    assert TEST_TIMEOUT_S - 60 < remaining <= TEST_TIMEOUT_S
    # What the servers are deployed with waits that long for /health, and the documentation gives the same numbers.
    engine = SimpleNamespace(venv=Path("/engine/venv"), cache=Path("/engine/cache"))
    assert real_deployment(engine, Path("/model"), Path("/node"))["health_timeout_s"] == HEALTH_WAIT_S
    doc = " ".join((REPO / "docs" / "real-engine.md").read_text().split())
    for name, value in [("ENGINE_BUILD_S", ENGINE_BUILD_S), ("MODEL_BUILD_S", MODEL_BUILD_S), ("HEALTH_WAIT_S", HEALTH_WAIT_S), ("WORKLOAD_S", WORKLOAD_S),
                        ("TEST_TIMEOUT_S", TEST_TIMEOUT_S)]:
        assert f"{value} s (`{name}`)" in doc, name
