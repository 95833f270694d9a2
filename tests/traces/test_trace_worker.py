"""The upload's analysis really runs in a worker: a web request keeps the file and queues the task on commit; a
real Celery worker (tests.orchestration's cluster) reads and analyses it while the page polls its progress."""
from __future__ import annotations

import time
from datetime import timedelta

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from gates.models import CustomerTrace
from tests.orchestration.conftest import cluster, fast_settings  # noqa: F401  (fixtures)
from tests.traces.test_trace_page import conversation_trace


def analysed(row: CustomerTrace, seconds: float = 600) -> CustomerTrace:
    """The row once a worker ended its analysis (or as it was after `seconds`)."""
    deadline = time.monotonic() + seconds
    while row.state not in ("ready", "refused") and time.monotonic() < deadline:
        time.sleep(0.2)
        row.refresh_from_db()
    return row


def test_a_worker_analyses_the_upload_the_web_request_only_kept(cluster, signed_pilot, client):  # noqa: F811
    cluster.worker("control", [cluster.control])
    client.force_login(signed_pilot.bob)
    response = client.post(reverse("pilot_trace_upload", args=[signed_pilot.pilot.code]),
                           {"trace": SimpleUploadedFile("conv.jsonl", conversation_trace(30, 3))})
    assert response.status_code == 302
    row = CustomerTrace.objects.get()
    analysed(row)
    assert row.state == "ready", cluster.logs()
    assert row.turns == 90 and row.analysis["reuse"]["known"] and row.progress == 1.0
    page = client.get(reverse("pilot_traces", args=[signed_pilot.pilot.code])).content.decode()
    assert "Reuse share:" in page and "Reuse captured against cache capacity" in page


def test_an_analysis_whose_message_was_lost_is_queued_again_by_the_sweep(cluster, signed_pilot, client):  # noqa: F811
    from runners.engine import reconcile

    client.force_login(signed_pilot.bob)
    response = client.post(reverse("pilot_trace_upload", args=[signed_pilot.pilot.code]),
                           {"trace": SimpleUploadedFile("conv.jsonl", conversation_trace(20, 3))})
    assert response.status_code == 302
    row = CustomerTrace.objects.get()
    assert reconcile()["traces"] == 0                      # just queued: its message may still be on its way
    cluster.worker("control", [cluster.control])           # purges the queue first: the upload's message is lost
    CustomerTrace.objects.filter(pk=row.pk).update(heartbeat=timezone.now() - timedelta(minutes=5))
    assert reconcile()["traces"] == 1
    assert reconcile()["traces"] == 0                      # one dispatch per row and stale period
    analysed(row)
    assert row.state == "ready" and row.turns == 60, cluster.logs()
