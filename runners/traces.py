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

from gates.lifecycle import audit, set_sample_trace
from gates.models import CustomerTrace, Gate, Party, PlanTamperedError, PlanVersion
from gates.plan import TRACE_GATE
from gates.sizing import length_summary, trace_session_lengths
from runners.remote.workload import TraceError, load_trace
from runners.validators import validate_trace_size


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
    """Whether the plan both parties signed lets G4 replay a generated sample trace.

    Read from the signed plan as verified against the signatures (its hash covers the permission): a draft
    that allows it does not count, and a signed plan whose contents no longer hash to what was signed
    raises PlanTamperedError.
    """
    version = gate.pilot.signed_plan
    return version is not None and version.verified_plan().gate(gate.number).sample_trace


def allow_sample(version: PlanVersion, who, allowed: bool = True) -> PlanVersion:
    """Let a draft plan's G4 replay a generated sample trace (`gates.lifecycle.set_sample_trace`, audited).

    For a demo or a rehearsal without the customer's traffic: both parties then sign a plan that says so,
    and every page and report of the G4 run says "generated sample trace — not the customer's traffic".
    """
    return set_sample_trace(version, allowed, who)


def trace_for_run(gate: Gate) -> tuple[bytes | None, CustomerTrace | None]:
    """(bytes, row) of the trace G4 must replay; (None, None) when the plan allows the sample trace; else refused."""
    trace = current(gate)
    if trace is not None:
        return read(trace), trace
    try:
        allowed = sample_allowed(gate)
    except PlanTamperedError as exc:
        raise TraceRefused(str(exc)) from None
    if allowed:
        return None, None
    raise TraceRefused(f"{gate.label} needs the customer's session trace: upload it on the {gate.label} page or give "
                       "run_gate --trace FILE (the signed plan does not allow a generated sample trace)")
