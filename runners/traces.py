"""The customer's session trace for G4: validated as the workload client reads it, hashed, summarised, kept.

A trace is uploaded on the G4 gate page (or given to `run_gate --trace`) before the run. G4 starts only
with one, unless the signed plan's G4 says `sample_trace: allowed`; then it replays a generated sample
trace and every page and report says so.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError

from gates.lifecycle import TransitionRefused, audit, plan_editable
from gates.models import CustomerTrace, Gate, Party, PlanVersion
from gates.sizing import length_summary, trace_session_lengths
from runners.remote.workload import TraceError, load_trace
from runners.validators import validate_trace_size

TRACE_GATE = 4


class TraceRefused(ValueError):
    """A trace that cannot be used, with the line and column at fault."""


def parse(data: bytes, name: str = "customer-trace.csv") -> list:
    """The trace's turns, read exactly as the workload client will; errors name `name`, the line and the column."""
    if not data:
        raise TraceRefused(f"{name}: the file is empty")
    with tempfile.NamedTemporaryFile(suffix=".csv") as handle:
        handle.write(data)
        handle.flush()
        try:
            return load_trace(handle.name)
        except TraceError as error:
            raise TraceRefused(str(error).replace(handle.name, name)) from None


def summarise(data: bytes, name: str) -> dict[str, Any]:
    turns = parse(data, name)
    tokens = trace_session_lengths(turns)
    return {"sessions": len(tokens), "turns": len(turns), "lengths": length_summary(tokens)}


def _store_file(pilot_code: str, sha256: str, data: bytes) -> str:
    relative = Path("traces") / pilot_code / f"{sha256}.csv"
    target = Path(settings.DATA_DIR) / relative
    if target.exists():
        return str(relative)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".incoming-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o444)
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return str(relative)


def upload(gate: Gate, data: bytes, name: str, user, party: str) -> CustomerTrace:
    """Validate, hash and keep the customer's trace for `gate` (G4); a bad file is refused and nothing is stored."""
    if gate.number != TRACE_GATE:
        raise TraceRefused(f"a trace is replayed by G{TRACE_GATE} only, not by {gate.label}")
    name = Path(name or "customer-trace.csv").name[:200]
    try:
        validate_trace_size(len(data))
    except ValidationError as error:
        raise TraceRefused(f"{name}: " + " ".join(error.messages)) from None
    summary = summarise(data, name)
    sha256 = hashlib.sha256(data).hexdigest()
    trace = CustomerTrace.objects.create(
        pilot=gate.pilot, gate=gate, name=name, path=_store_file(str(gate.pilot.code), sha256, data), sha256=sha256,
        size=len(data), sessions=summary["sessions"], turns=summary["turns"], lengths=summary["lengths"],
        uploaded_by=user if getattr(user, "pk", None) else None, party=party or Party.CUSTOMER,
    )
    audit(gate.pilot, user, "trace.uploaded", trace, name=name, sha256=sha256, sessions=trace.sessions, turns=trace.turns)
    return trace


def current(gate: Gate) -> CustomerTrace | None:
    """The trace the next G4 run replays: the latest uploaded."""
    return gate.traces.order_by("-created", "-id").first() if gate.number == TRACE_GATE else None


def read(trace: CustomerTrace) -> bytes:
    data = (Path(settings.DATA_DIR) / trace.path).read_bytes()
    if hashlib.sha256(data).hexdigest() != trace.sha256:
        raise TraceRefused(f"{trace.name}: the stored file no longer hashes to {trace.sha256}")
    return data


def sample_allowed(gate: Gate) -> bool:
    """Whether the signed plan's G4 explicitly allows a generated sample trace (`sample_trace: allowed`)."""
    version = gate.pilot.signed_plan
    for item in (version.document.get("gates", []) if version else []):
        if item.get("number") == gate.number:
            return str(item.get("sample_trace", "")).strip().lower() == "allowed"
    return False


def allow_sample(version: PlanVersion, who) -> PlanVersion:
    """Write `sample_trace: allowed` into a draft plan's G4, before either party approves it; audited.

    For a demo or a rehearsal without the customer's traffic: both parties then sign a plan that says so,
    and every page and report of the G4 run says "generated sample trace — not the customer's traffic".
    """
    if not plan_editable(version):
        raise TransitionRefused("plan-frozen", f"plan v{version.number} is already approved or signed; "
                                               "a sample trace can only be allowed in a draft")
    for item in version.document.get("gates", []):
        if item.get("number") == TRACE_GATE:
            item["sample_trace"] = "allowed"
    version.save(update_fields=["document"])
    audit(version.pilot, who, "plan.sample_trace_allowed", version, gate=TRACE_GATE)
    return version


def trace_for_run(gate: Gate) -> tuple[bytes | None, CustomerTrace | None]:
    """(bytes, row) of the trace G4 must replay; (None, None) when the plan allows the sample trace; else refused."""
    trace = current(gate)
    if trace is not None:
        return read(trace), trace
    if sample_allowed(gate):
        return None, None
    raise TraceRefused(f"{gate.label} needs the customer's session trace: upload it on the {gate.label} page or give "
                       "run_gate --trace FILE (the signed plan does not allow a generated sample trace)")
