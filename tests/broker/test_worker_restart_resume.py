"""A supervised worker that dies and is started again under its node name resumes what it held at the next
sweep, not after the stale-heartbeat delay (runners.tasks.resume_what_a_dead_predecessor_held)."""
from __future__ import annotations

import re
import time

import pytest

from runners.models import Status, Step
from runners.orchestration import wait_for
from tests.orchestration.conftest import cluster, fast_settings, local_site  # noqa: F401
from tests.orchestration.test_engine import local_job, two_lanes, until

pytestmark = [pytest.mark.django_db(transaction=True)]
STALE = 90.0


def test_a_worker_restarted_under_its_name_resumes_its_steps_within_seconds(cluster, signed_pilot, local_site,  # noqa: F811
                                                                            tmp_path):
    site, nodes = local_site
    cluster.environment["FXPILOT_STALE_SECONDS"] = str(STALE)  # the production default: far longer than the test
    worker = cluster.worker("same", [cluster.control, site.queue])
    cluster.reconciler()
    job = local_job(signed_pilot.pilot, site, two_lanes(nodes, count=20, pause=0.25))
    work = Step.objects.get(job=job, seq=2)
    until(lambda: work.refresh_from_db() or work.requests_done >= 3)
    worker.kill()
    killed = time.monotonic()
    cluster.worker("same", [cluster.control, site.queue])
    job = wait_for(job, STALE - 30)
    assert job.status == Status.SUCCESSFUL, cluster.logs()
    assert time.monotonic() - killed < STALE / 2
    logs = "".join(path.read_text(errors="replace") for path in tmp_path.glob("worker-same-*.log"))
    assert re.search(r"same@\S+ was restarted: [12] step\(s\) its predecessor held", logs), cluster.logs()
    assert [s.attempts for s in job.steps.order_by("seq")] == [1, 1, 1, 1, 1]
