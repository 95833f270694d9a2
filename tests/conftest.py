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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduler for `make test`: a test file goes to one session whole (its module fixtures and
    its tests' order stay together), and so does each directory in SHARED_SET_UP."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFileAndSharedDirectory(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            parts = path.split("/")
            return "/".join(parts[:2]) if len(parts) > 2 and parts[1] in SHARED_SET_UP else path

        def _assign_work_unit(self, node) -> None:
            # xdist queues the groups by their number of tests (--loadscope-reorder, its default): the FIRST
            # groups (19 tests, 16th in that order), then the LONG ones, go out before any other, whatever their size
            for scope in reversed([f"tests/{name}" for name in FIRST] + list(LONG)):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return ByFileAndSharedDirectory(config, log)


# Started first, so the longest set-up overlaps the rest of the suite instead of ending it: the first unit of work
# a session is given (the scheduler above), and the first tests of a session without xdist. Only groups that use
# no test database may move (pytest-django's order of database tests stays), and tests/real stays last.
FIRST = ("demo",)
# The files whose few tests take minutes each (benchmarks/ci/by_file.py on a CI run's report), longest first, sent
# out right after FIRST so that the parallel sessions end together: queued by their number of tests they went out
# last, and a session ran the 4-minute two-network test alone while the others had finished. Only the parallel
# sessions' order moves; xdist already sends a file of database tests before one of transactional tests when it is
# larger (pytest-django's order holds within a session's collection, not across the groups xdist hands out).
LONG = ("tests/topology/test_two_networks.py", "tests/orchestration/test_evidence_edges.py",
        "tests/portal/test_browser.py", "tests/orchestration/test_gate_failures.py",
        "tests/broker/test_service_restarts.py", "tests/orchestration/test_gate_runs.py",
        "tests/orchestration/test_gate_runs_g2_g4.py", "tests/orchestration/test_node_lease_runs.py")


class _LongestFirst:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        """After pytest-django's order: the FIRST directories' tests to the front."""
        root = Path(__file__).resolve().parent
        first = [item for item in items if _top_directory(item, root) in FIRST]
        if first:
            chosen = set(map(id, first))
            items[:] = first + [item for item in items if id(item) not in chosen]


def _top_directory(item, root: Path) -> str | None:
    try:
        return Path(str(item.fspath)).resolve().relative_to(root).parts[0]
    except ValueError:
        return None


def pytest_configure(config):
    config.pluginmanager.register(_LongestFirst(), "fxpilot-longest-first")


def _cpu_seconds() -> float:
    """CPU time of this session and of the processes it started and reaped (Celery workers, simulated nodes, demos,
    servers: whatever a test waits for when it stops them); a daemon that is never reaped is not counted."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_CPU_AT_START = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT_START] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Every test's CPU seconds (set-up, call and tear-down, with what it reaped) as the property `cpu_s` of its
    JUnit record: benchmarks/ci/by_file.py sums them per file. Wall time says what a test waited; this says what it
    cost the machine, which is what a loaded CI runner runs short of."""
    if call.when == "teardown" and _CPU_AT_START in item.stash:
        item.user_properties.append(("cpu_s", round(_cpu_seconds() - item.stash[_CPU_AT_START], 2)))
    yield



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
    from portal.management.commands.seed_demo import DEMO_PASSWORD, seed

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
