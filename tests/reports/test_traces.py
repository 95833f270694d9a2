"""The customer's G4 trace: refused with the line at fault, hashed, summarised; G4 needs one unless the plan allows."""
from __future__ import annotations

import hashlib

import pytest

from gates.models import AuditEvent, CustomerTrace
from runners import traces

GOOD = (b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\n"
        b"a,1,1000,100,0\na,2,3000,100,5\nb,1,40000,200,1\n")


def test_a_good_trace_is_hashed_summarised_and_audited(signed_pilot):
    gate = signed_pilot.pilot.gate(4)
    trace = traces.upload(gate, GOOD, "../../etc/ours.csv", signed_pilot.bob, "customer")
    assert trace.name == "ours.csv" and trace.sha256 == hashlib.sha256(GOOD).hexdigest()
    assert (trace.sessions, trace.turns) == (2, 3)
    assert trace.lengths["min"] == 3100 and trace.lengths["max"] == 40200 and trace.lengths["p50"] == 3100
    assert sum(count for _, count in trace.lengths["histogram"]) == 2
    assert traces.current(gate) == trace and traces.read(trace) == GOOD
    assert traces.trace_for_run(gate) == (GOOD, trace)
    assert AuditEvent.objects.filter(action="trace.uploaded", object_id=str(trace.pk)).exists()


@pytest.mark.parametrize(("data", "where"), [
    (b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,ten,1,0\n", "line 2, column prompt_tokens"),
    (b"session,turn\n", "line 1: missing column"),
    (b"", "the file is empty"),
])
def test_a_bad_trace_is_refused_naming_the_line_and_nothing_is_kept(signed_pilot, data, where):
    with pytest.raises(traces.TraceRefused, match=where):
        traces.upload(signed_pilot.pilot.gate(4), data, "t.csv", signed_pilot.bob, "customer")
    assert not CustomerTrace.objects.exists()


def test_g4_needs_the_customers_trace_unless_the_plan_allows_a_sample(signed_pilot):
    gate = signed_pilot.pilot.gate(4)
    with pytest.raises(traces.TraceRefused, match="needs the customer's session trace"):
        traces.trace_for_run(gate)
    with pytest.raises(traces.TraceRefused, match="G4 only"):
        traces.upload(signed_pilot.pilot.gate(3), GOOD, "t.csv", signed_pilot.bob, "customer")


def test_a_plan_that_says_so_lets_g4_replay_the_generated_sample(demo):
    from gates import lifecycle

    version = demo.pilot.latest_plan
    for item in version.document["gates"]:
        if item["number"] == 4:
            item["sample_trace"] = "allowed"
    version.save(update_fields=["document"])
    lifecycle.sign_plan(version, demo.alice)
    lifecycle.sign_plan(version, demo.bob)
    assert traces.trace_for_run(demo.pilot.gate(4)) == (None, None)
