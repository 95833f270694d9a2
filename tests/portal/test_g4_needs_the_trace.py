"""G4 started from the portal without the customer's trace is refused and says what to do; with it, it runs."""
from __future__ import annotations

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from runners.models import Job, Node, Site
from tests.orchestration.conftest import open_gate
from tests.reports.test_service import CUSTOMER_TRACE
from tests.traces.helpers import run_trace_jobs


def test_the_portal_refuses_g4_without_the_trace_and_starts_it_once_uploaded(signed_pilot, client):
    pilot = signed_pilot.pilot
    site = Site.objects.create(pilot=pilot, name="site1", queue="q-site1")
    Node.objects.create(site=site, name="node1", host="127.0.0.1", username="fxpilot", simulated=True)
    open_gate(pilot, 4, signed_pilot)
    client.force_login(signed_pilot.alice)
    page = client.post(reverse("run_start", args=[pilot.code, 4]), follow=True).content.decode()
    assert "G4 needs the customer&#x27;s session trace: upload it on the G4 page" in page
    assert not Job.objects.exists()
    client.post(reverse("gate_trace", args=[pilot.code, 4]), {"trace": SimpleUploadedFile("ours.csv", CUSTOMER_TRACE)})
    page = client.post(reverse("run_start", args=[pilot.code, 4]), follow=True).content.decode()
    assert "still being read and analysed" in page and not Job.objects.exists()   # not before the worker read it
    assert run_trace_jobs() == ["ready"]
    response = client.post(reverse("run_start", args=[pilot.code, 4]))
    job = Job.objects.get()
    assert response.status_code == 302 and response.url == reverse("run", args=[job.code])
    assert job.artifacts.get(kind="trace").name == "customer-trace.csv"
