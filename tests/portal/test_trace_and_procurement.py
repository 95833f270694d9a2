"""G4's trace uploaded on its page; G4 signed off by both parties makes the procurement report, pinned on the overview."""
from __future__ import annotations

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from gates import lifecycle
from gates.models import CustomerTrace, Report
from tests.reports.test_service import CUSTOMER_TRACE, _evaluate
from tests.reports.test_truth import _walk_to
from tests.traces.helpers import run_trace_jobs


def _upload(client, pilot, data: bytes, name: str = "ours.csv"):
    """Upload on the G4 page, let the worker read it, and show the trace page (the G4 page when it is good)."""
    answer = client.post(reverse("gate_trace", args=[pilot.code, 4]), {"trace": SimpleUploadedFile(name, data)})
    if answer.status_code != 302:
        return answer
    if run_trace_jobs() == ["ready"]:
        return client.get(reverse("gate", args=[pilot.code, 4]))
    return client.get(reverse("pilot_traces", args=[pilot.code]))


def test_either_party_uploads_the_trace_and_a_bad_one_names_its_line(signed_pilot, client):
    pilot = signed_pilot.pilot
    client.force_login(signed_pilot.carol)  # the customer's engineer
    page = _upload(client, pilot, b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,x,1,0\n")
    assert "line 2, column prompt_tokens" in page.content.decode()
    assert CustomerTrace.objects.get().state == "refused" and not CustomerTrace.objects.filter(state="ready").exists()
    CustomerTrace.objects.all().delete()
    page = _upload(client, pilot, CUSTOMER_TRACE).content.decode()
    trace = CustomerTrace.objects.get()
    assert trace.sessions == 10 and trace.sha256 in page and "90th percentile" in page
    client.force_login(signed_pilot.charlie)
    assert _upload(client, pilot, CUSTOMER_TRACE).status_code == 404


def test_signing_off_g4_as_both_parties_pins_the_countersigned_procurement_report(signed_pilot, client):
    pilot = signed_pilot.pilot
    pilot.signed_people = (signed_pilot.alice, signed_pilot.bob)
    _walk_to(pilot, 4)
    evaluation = _evaluate(pilot, 4)
    lifecycle.record_verdict(pilot.gate(4), evaluation, who="test")
    for person in (signed_pilot.alice, signed_pilot.bob):
        client.force_login(person)
        client.post(reverse("gate_signoff", args=[pilot.code, 4]), {"decision": "approve", "comment": ""})
    pilot.refresh_from_db()
    assert pilot.state == "completed"
    final = Report.objects.get(kind="procurement", supersedes__isnull=False)
    assert final.countersigned_by == signed_pilot.bob and final.version == 2
    overview = client.get(reverse("pilot", args=[pilot.code])).content.decode()
    assert "Proven: every gate passed" in overview and reverse("report_download", args=[final.code]) in overview
    listing = client.get(reverse("reports", args=[pilot.code])).content.decode()
    assert "final" in listing and "superseded" in listing and "countersigned by Bob Wang" in listing
