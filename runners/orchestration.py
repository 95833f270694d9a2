"""Gate runs as the rest of the product sees them: start one, cancel one, follow one.

The portal, the API and the management commands use these names; code inside runners/ imports
them from the module that owns each (docs/architecture.md).
"""
from runners.engine import reconcile, request_cancel
from runners.progress import job_progress, log_since, wait_for
from runners.runs import RunRefused, start_gate_run
from runners.traces import TraceRefused
from runners.traces import current as current_trace
from runners.traces import receive as receive_trace
from runners.traces import upload as upload_trace

__all__ = ["RunRefused", "TraceRefused", "current_trace", "job_progress", "log_since", "reconcile", "request_cancel",
           "receive_trace", "start_gate_run", "upload_trace", "wait_for"]
