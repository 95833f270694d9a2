"""A trace upload as the portal's pages take it: the trace page and the G4 page both post the same form here."""
from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest
from django.utils.translation import gettext as _

from gates import policy
from gates.lifecycle import FINAL, TransitionRefused
from gates.models import CustomerTrace, Party, Pilot, Role
from gates.policy import Act
from portal.forms import TraceUploadForm
from runners import orchestration


def receive_upload(request: HttpRequest, pilot: Pilot, gate, roles) -> CustomerTrace | None:
    """The upload form's trace kept at once and queued for a worker (orchestration.receive_trace), as the trace
    page and the G4 page take it; None, with the reason said to the person, when it was not kept."""
    form = TraceUploadForm(request.POST, request.FILES)
    refused = policy.refusal(Act.UPLOAD_TRACE, gate, roles)
    if refused is not None:
        messages.error(request, _("This pilot is closed: it takes no more traces.") if pilot.state in FINAL
                       else refused.message)
        return None
    if not form.is_valid():
        for errors in form.errors.values():
            messages.error(request, " ".join(errors))
        return None
    upload = form.cleaned_data["trace"]
    party = Party.VENDOR if roles & {Role.VENDOR_ENGINEER, Role.VENDOR_LEAD} else Party.CUSTOMER
    try:
        if hasattr(upload, "temporary_file_path"):   # a large upload, streamed to disk by Django: never read whole
            row = orchestration.receive_trace_file(pilot, upload.temporary_file_path(), upload.name, request.user, party)
        else:
            row = orchestration.receive_trace(pilot, upload.read(), upload.name, request.user, party)
    except TransitionRefused as refusal:
        messages.error(request, refusal.message)
        return None
    except orchestration.TraceRefused as refusal:
        messages.error(request, _("The trace was refused: %(error)s") % {"error": refusal})
        return None
    messages.success(request, _("The trace %(name)s is kept (SHA-256 %(sha)s); it is being read and analysed in the "
                                "background.") % {"name": row.name, "sha": row.sha256})
    return row
