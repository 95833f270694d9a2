"""Gate runs as the rest of the product sees them: start one, cancel one, follow one.

The portal, the API and the management commands use these names; code inside runners/ imports
them from the module that owns each (docs/architecture.md).
"""
from gates import policy
from gates.models import CustomerTrace, Gate
from runners import traces
from runners.engine import reconcile, request_cancel
from runners.progress import job_progress, log_since, wait_for
from runners.runs import RunRefused, start_gate_run
from runners.traces import TraceRefused
from runners.traces import current as current_trace

__all__ = ["RunRefused", "TraceRefused", "current_trace", "job_progress", "log_since", "reconcile", "receive_trace",
           "request_cancel", "start_gate_run", "upload_trace", "wait_for"]


def upload_trace(gate: Gate, data: bytes, name: str, user, party: str) -> CustomerTrace:
    """The customer's trace for G4 (runners.traces.upload), once the policy allows it (UPLOAD_TRACE)."""
    policy.require(policy.Act.UPLOAD_TRACE, gate, policy.actor_roles(gate.pilot, user))
    return traces.upload(gate, data, name, user, party)


def receive_trace(pilot, data: bytes, name: str, user, party: str) -> CustomerTrace:
    """The customer's trace kept at once and analysed by a worker (runners.traces.receive), once the policy allows
    it (UPLOAD_TRACE on the pilot's G4: any stage before the pilot closes)."""
    gate = pilot.gate(traces.TRACE_GATE)
    policy.require(policy.Act.UPLOAD_TRACE, gate, policy.actor_roles(pilot, user))
    return traces.receive(pilot, data, name, user, party)


def receive_trace_file(pilot, path, name: str, user, party: str) -> CustomerTrace:
    """`receive_trace` for an upload already on disk (Django's temporary file of a large upload): hashed and stored
    in chunks, never read whole into memory (runners.traces.receive_file)."""
    gate = pilot.gate(traces.TRACE_GATE)
    policy.require(policy.Act.UPLOAD_TRACE, gate, policy.actor_roles(pilot, user))
    return traces.receive_file(pilot, path, name, user, party)
