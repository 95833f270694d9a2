"""The customer's session trace for G4: validated as the workload client reads it, hashed, summarised, kept.

A trace is uploaded on the G4 gate page (or given to `run_gate --trace`) before the run. G4 starts only
with one, unless the plan both parties signed allows a generated sample trace (G4's `sample_trace`); then
it replays a generated sample trace and every page and report says so.

The bytes live in the evidence store with the artifacts and reports (files under DATA_DIR in the embedded
default, objects in the S3-compatible store in production), hashed on upload and hashed again on every
read. The run keeps its own copy as an artifact, which the worker that replays it reads from the store.
"""
from __future__ import annotations

import hashlib
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import current_app
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from gates.lifecycle import audit, set_sample_trace
from gates.models import CustomerTrace, Gate, Party, PlanTamperedError, PlanVersion
from gates.plan import TRACE_GATE
from gates.sizing import Turn, length_summary, trace_session_lengths
from gates.traces.analysis import analyse, report, session_final_lengths
from gates.traces.formats import (
    FORMATS,
    GZIP_MAGIC,
    PUBLIC_FORMATS,
    TraceFormatError,
    bounded_heap,
    detect_format,
    plain_file,
    read_bytes,
    read_trace,
    release_memory,
)
from runners.artifacts import (
    ArtifactMismatch,
    EvidenceStoreError,
    get_bytes,
    iter_chunks,
    put_bytes,
    put_file,
    sha256_file,
)
from runners.remote.workload import TraceError, load_trace
from runners.validators import validate_trace_size


class TraceRefused(ValueError):
    """A trace that cannot be used, with the line and column at fault.

    `words()`, when given, says the same in the active language (a refusal kept on the trace's row is stored in
    every language the portal speaks)."""

    def __init__(self, message: str, words=None):
        super().__init__(message)
        self.words = words or (lambda: message)


def parse(data: bytes, name: str = "customer-trace.csv") -> list:
    """The trace's turns; errors name `name`, the line and the column (or field).

    fxpilot's session CSV is read exactly as the workload client will; the public formats (Mooncake/FAST'25
    JSONL, Azure LLM inference CSV, BurstGPT CSV: docs/traces.md) are recognised and read as they are — G4's
    replay step samples them by whole sessions into the client's CSV (runners.tracereplay).
    """
    if not data:
        raise TraceRefused(_("%(name)s: the file is empty") % {"name": name})
    data = gunzipped(data, name)
    fmt = sniff(data)
    if fmt in PUBLIC_FORMATS or fmt == "mooncake-like":
        return public_turns(data, name, None if fmt == "mooncake-like" else fmt)
    with tempfile.NamedTemporaryFile(suffix=".csv") as handle:
        handle.write(data)
        handle.flush()
        try:
            return load_trace(handle.name)
        except TraceError as error:
            raise _refused(lambda e=error: translate_trace_error(e, name)) from None


def _refused(words) -> TraceRefused:
    return TraceRefused(words(), words)


def gunzipped(data: bytes, name: str) -> bytes:
    """The bytes as they are, or decompressed when they are gzip (told by the magic bytes, whatever the name)."""
    if not data.startswith(GZIP_MAGIC):
        return data
    import gzip
    import zlib
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as error:
        raise _refused(lambda e=error: _("%(name)s: a gzip file that cannot be decompressed: %(error)s")
                       % {"name": name, "error": e}) from None


def sniff(data: bytes) -> str | None:  # (the first 64 KiB are enough)
    """The format of a trace's bytes (gates.traces detection on the first line and, for JSON, the first 64 KiB), or
    the public format its first line is meant to be when a column is missing, so the message names it."""
    head = data[:1 << 16].decode("utf-8-sig", "replace")
    first = next((line for line in head.splitlines() if line.strip()), "")
    found = detect_format(first, head) or _format_hint(first)
    if found is None and first.lstrip().startswith(("{", "[")):
        return "mooncake-like"       # JSON of no known shape: gates.traces refuses it, naming what it looks like
    return found


def _format_hint(first_line: str) -> str | None:
    """The public format a CSV first line is meant to be, when a column is missing (so the message names it)."""
    names = {n.strip() for n in first_line.split(",")}
    if "TIMESTAMP" in names or "ContextTokens" in names:
        return "azure"
    if "Request tokens" in names or "Response tokens" in names:
        return "burstgpt"
    return None


def public_turns(data: bytes, name: str, fmt: str | None = None) -> list[Turn]:
    """A public-format trace as session turns (sessions given, inferred or one per request: docs/traces.md)."""
    try:
        analysis = analyse(read_bytes(data, name, fmt))
    except TraceFormatError as error:
        raise _refused(lambda e=error: translate_format_error(e)) from None
    trace = analysis.trace
    order = trace.arrival_order()
    turns, counter = [], {}
    for i in order.tolist():
        session = int(analysis.session[i])
        counter[session] = counter.get(session, 0) + 1
        turns.append(Turn(f"s{session}", counter[session], int(trace.input_tokens[i]), int(trace.output_tokens[i])))
    return turns


def _reason(template: str, values: dict) -> str:
    """A message template made where the error was found, in the active language, with its values."""
    return _(template) % values if values else _(template)


def _place(name: str, fmt: str, line, field: str | None, word: str = "field") -> str:
    where = {"name": name, "format": fmt, "line": line, "field": field}
    if line is not None and field:
        if word == "column":
            return _("%(name)s, line %(line)s, column %(column)s") % {**where, "column": field}
        return (_("%(name)s (%(format)s), line %(line)s, field %(field)s") if fmt
                else _("%(name)s, line %(line)s, field %(field)s")) % where
    if line is not None:
        return (_("%(name)s (%(format)s), line %(line)s") if fmt else _("%(name)s, line %(line)s")) % where
    return (_("%(name)s (%(format)s)") % where) if fmt else name


def translate_format_error(error: TraceFormatError) -> str:
    """A gates.traces complaint in the active language: the place (file, format, line, field) and the reason,
    from the template and values the reader gave it (no English is read back)."""
    place = _place(error.name, FORMATS.get(error.format or "", ""), error.line, error.field)
    return _("%(name)s: %(error)s") % {"name": place, "error": _reason(error.template, error.values)}


def translate_trace_error(error: TraceError, name: str | None = None) -> str:
    """The workload client's complaint about a trace, in the active language; `name` stands for the file's path
    (a temporary copy's) when given."""
    place = _place(name or error.path, "", error.line, error.column, word="column")
    return _("%(name)s: %(error)s") % {"name": place, "error": _reason(error.template, error.values)}


def storage_name(pilot_code: str, sha256: str) -> str:
    """The trace's name in the evidence store: content-addressed under its pilot."""
    return f"traces/{pilot_code}/{sha256}.csv"


def _checked_name(name: str, data: bytes) -> str:
    """The upload's file name as kept (no folders, at most 200 characters), once its size is within bounds."""
    name = Path(name or "customer-trace.csv").name[:200]
    try:
        validate_trace_size(len(data))
    except ValidationError as error:
        raise TraceRefused(_("%(name)s: %(error)s") % {"name": name, "error": " ".join(error.messages)}) from None
    return name


def _keep(pilot, data: bytes, name: str) -> tuple[str, str]:
    """(SHA-256, evidence-store name) of the trace's bytes, stored under their content address."""
    sha256 = hashlib.sha256(data).hexdigest()
    stored = storage_name(str(pilot.code), sha256)
    try:
        put_bytes(stored, data, sha256)
    except (ArtifactMismatch, OSError) as error:
        raise TraceRefused(_("%(name)s could not be kept in the evidence store: %(error)s")
                           % {"name": name, "error": error}) from None
    return sha256, stored


def upload(gate: Gate, data: bytes, name: str, user, party: str) -> CustomerTrace:
    """Validate, analyse, hash and keep the customer's trace for `gate` (G4) within the call (commands and tests; the
    portal uses `receive`); a bad file is refused and nothing is stored."""
    if gate.number != TRACE_GATE:
        raise TraceRefused(_("a trace is replayed by G%(number)s only, not by %(gate)s")
                           % {"number": TRACE_GATE, "gate": gate.label})
    name = _checked_name(name, data)
    summary = analyse_bytes(data, name)
    sha256, stored = _keep(gate.pilot, data, name)
    trace = CustomerTrace.objects.create(
        heartbeat=timezone.now(), pilot=gate.pilot, gate=gate, name=name, path=stored, sha256=sha256,
        size=len(data), sessions=summary["sessions"], turns=summary["turns"], lengths=summary["lengths"],
        format=summary["format"], analysis=summary["analysis"], analysed=timezone.now(),
        uploaded_by=user if getattr(user, "pk", None) else None, party=party or Party.CUSTOMER,
    )
    audit(gate.pilot, user, "trace.uploaded", trace, name=name, sha256=sha256, sessions=trace.sessions, turns=trace.turns)
    return trace


def current(gate: Gate) -> CustomerTrace | None:
    """The trace the next G4 run replays: the latest uploaded whose analysis found it good (one still being read
    or refused replaces nothing)."""
    if gate.number != TRACE_GATE:
        return None
    return gate.traces.filter(state=CustomerTrace.State.READY).order_by("-created", "-id").first()


# ── Upload at any stage, analysis in the background (issue 24, item 7) ──────────────────────────────────

ANALYSE_TRACE = "runners.tasks.analyse_trace"
LANGUAGES = ("en", "zh-hans")
# Share of the progress bar each stage of the analysis takes (reading the file, then counting reuse).
READ_SHARE, REUSE_SHARE = 0.6, 0.35


def receive(pilot, data: bytes, name: str, user, party: str) -> CustomerTrace:
    """Keep an uploaded trace at once (size checked, hashed, in the evidence store) and queue its analysis.

    What a web request does: nothing here reads the trace's rows, so a 16 MB upload answers in about the time
    it takes to hash and store it. The row is `queued`; `runners.tasks.analyse_trace` reads, checks and
    analyses it (`analyse_row`). It belongs to the pilot's G4, whatever stage the pilot is at."""
    gate = pilot.gate(TRACE_GATE)
    name = _checked_name(name, data)
    if not data:
        raise TraceRefused(_("%(name)s: the file is empty") % {"name": name})
    sha256, stored = _keep(pilot, data, name)
    trace = CustomerTrace.objects.create(
        pilot=pilot, gate=gate, name=name, path=stored, sha256=sha256, size=len(data),
        state=CustomerTrace.State.QUEUED, progress=0.0, stage="queued",
        uploaded_by=user if getattr(user, "pk", None) else None, party=party or Party.CUSTOMER,
    )
    audit(pilot, user, "trace.uploaded", trace, name=name, sha256=sha256, size=len(data))
    transaction.on_commit(lambda: current_app.signature(ANALYSE_TRACE, args=(trace.pk,)).apply_async(
        queue=settings.CELERY_TASK_DEFAULT_QUEUE))
    return trace


class _Progress:
    """Writes the row's progress at most twice a second (one UPDATE, never the whole row)."""

    def __init__(self, pk: int):
        self.pk, self.last = pk, 0.0

    def __call__(self, value: float, stage: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= 0.5:
            self.last = now
            CustomerTrace.objects.filter(pk=self.pk).update(progress=round(min(1.0, max(0.0, value)), 4), stage=stage,
                                                            heartbeat=timezone.now())


def analyse_bytes(data: bytes, name: str, progress=None) -> dict[str, Any]:
    """Read, check and analyse a trace held in memory (`analyse_file` on a temporary copy)."""
    if not data:
        raise _refused(lambda: _("%(name)s: the file is empty") % {"name": name})
    with tempfile.NamedTemporaryFile(suffix=".trace") as handle:
        handle.write(data)
        handle.flush()
        del data
        return analyse_file(Path(handle.name), name, progress)


def analyse_file(path: Path, name: str, progress=None) -> dict[str, Any]:
    """Read, check and analyse a trace file (gzip or not, told by its magic bytes): {format, sessions, turns,
    lengths, analysis}; TraceRefused naming the file, line and field at fault. fxpilot's CSV is also read exactly as
    the workload client will replay it. The file is read as a stream: nothing holds its bytes whole."""
    def say(value: float, stage: str) -> None:
        if progress is not None:
            progress(value, stage)
    if not path.stat().st_size:
        raise _refused(lambda: _("%(name)s: the file is empty") % {"name": name})
    try:
        with plain_file(path, name) as plain:
            with open(plain, "rb") as f:
                head = f.read(1 << 16)
            fmt = sniff(head)
            lengths = None
            if fmt not in PUBLIC_FORMATS and fmt != "mooncake-like":
                try:
                    turns = load_trace(str(plain))
                except TraceError as error:
                    raise _refused(lambda e=error: translate_trace_error(e, name)) from None
                lengths = trace_session_lengths(turns)
                del turns
            trace = read_trace(plain, name=name, progress=lambda share: say(READ_SHARE * share, "reading"))
            say(READ_SHARE, "reuse")
            analysis = analyse(trace)
            say(READ_SHARE + REUSE_SHARE, "summary")
            result = report(analysis)
    except TraceFormatError as error:
        raise _refused(lambda e=error: translate_format_error(e)) from None
    finally:
        release_memory()
    if lengths is None:
        lengths = session_final_lengths(analysis)
    return {"format": result["format"], "sessions": len(lengths), "turns": int(result["requests"]),
            "lengths": length_summary(lengths), "analysis": result}


def read_to_file(trace: CustomerTrace, target) -> None:
    """The uploaded trace from the evidence store into an open binary file, streamed and hashed again on the way:
    a trace altered or lost in the store is refused."""
    try:
        for chunk in iter_chunks(trace.path, trace.sha256):
            target.write(chunk)
    except ArtifactMismatch as error:
        raise TraceRefused(_("%(name)s cannot be used: %(error)s") % {"name": trace.name, "error": error}) from None
    target.flush()


def receive_file(pilot, source: Path | str, name: str, user, party: str) -> CustomerTrace:
    """`receive` for a trace already on disk (a streamed upload's temporary file): hashed and stored in chunks, never
    held whole in memory — the way to take a day of traffic (hundreds of MB). Its size is checked against the
    trace limit (runners.validators) first."""
    source = Path(source)
    gate = pilot.gate(TRACE_GATE)
    size = source.stat().st_size
    name = Path(name or "customer-trace.csv").name[:200]
    try:
        validate_trace_size(size)
    except ValidationError as error:
        raise TraceRefused(_("%(name)s: %(error)s") % {"name": name, "error": " ".join(error.messages)}) from None
    if not size:
        raise TraceRefused(_("%(name)s: the file is empty") % {"name": name})
    sha256 = sha256_file(source)
    stored = storage_name(str(pilot.code), sha256)
    try:
        put_file(stored, source, sha256, what=name)
    except (ArtifactMismatch, OSError, EvidenceStoreError) as error:
        raise TraceRefused(_("%(name)s could not be kept in the evidence store: %(error)s")
                           % {"name": name, "error": error}) from None
    trace = CustomerTrace.objects.create(
        pilot=pilot, gate=gate, name=name, path=stored, sha256=sha256, size=size,
        state=CustomerTrace.State.QUEUED, progress=0.0, stage="queued",
        uploaded_by=user if getattr(user, "pk", None) else None, party=party or Party.CUSTOMER,
    )
    audit(pilot, user, "trace.uploaded", trace, name=name, sha256=sha256, size=size)
    transaction.on_commit(lambda: current_app.signature(ANALYSE_TRACE, args=(trace.pk,)).apply_async(
        queue=settings.CELERY_TASK_DEFAULT_QUEUE))
    return trace


def _stale() -> Q:
    """A row nobody has shown work on for FXPILOT_STALE_SECONDS (rows from before the heartbeat: by their upload)."""
    before = timezone.now() - timedelta(seconds=settings.FXPILOT_STALE_SECONDS)
    return Q(heartbeat__lt=before) | Q(heartbeat__isnull=True, created__lt=before)


def analyse_row(pk: int) -> str:
    """The background job: read the kept trace, analyse it, and end the row `ready` or `refused` (saying why, in
    each language). Safe to run twice: a redelivered task finds the row done, or being analysed by a worker that
    showed progress within FXPILOT_STALE_SECONDS, and leaves it; a row whose analyser went silent is taken over."""
    taken = CustomerTrace.objects.filter(
        Q(state=CustomerTrace.State.QUEUED) | (Q(state=CustomerTrace.State.ANALYSING) & _stale()), pk=pk).update(
        state=CustomerTrace.State.ANALYSING, stage="reading", progress=0.0, heartbeat=timezone.now())
    if not taken:
        return "not queued"
    row = CustomerTrace.objects.get(pk=pk)
    bounded_heap()
    try:
        with tempfile.NamedTemporaryFile(prefix="trace-", suffix=".trace") as handle:
            read_to_file(row, handle)
            found = analyse_file(Path(handle.name), row.name, _Progress(pk))
    except TraceRefused as refused:
        refusal = {}
        for language in LANGUAGES:
            with translation.override(language):
                refusal[language] = refused.words()
        CustomerTrace.objects.filter(pk=pk).update(state=CustomerTrace.State.REFUSED, refusal=refusal,
                                                   stage="refused", progress=1.0, analysed=timezone.now())
        return "refused"
    CustomerTrace.objects.filter(pk=pk).update(
        state=CustomerTrace.State.READY, stage="ready", progress=1.0, analysed=timezone.now(),
        format=found["format"], sessions=found["sessions"], turns=found["turns"], lengths=found["lengths"],
        analysis=found["analysis"])
    return "ready"


def requeue_stale() -> int:
    """The reconcile sweep's part for traces: queue the analysis again of every row still queued or being analysed
    whose heartbeat is older than FXPILOT_STALE_SECONDS — its message was lost (the embedded broker loses what it
    held when it stops) or its worker died mid-analysis. One dispatch per row and stale period (the heartbeat moves
    with it); analyse_row takes a row once. Returns how many were queued again."""
    count = 0
    rows = CustomerTrace.objects.filter(
        _stale(), state__in=(CustomerTrace.State.QUEUED, CustomerTrace.State.ANALYSING)).values_list("pk", "heartbeat")
    for pk, heartbeat in rows:
        if CustomerTrace.objects.filter(pk=pk, heartbeat=heartbeat).update(
                state=CustomerTrace.State.QUEUED, stage="queued again", progress=0.0, heartbeat=timezone.now()):
            current_app.signature(ANALYSE_TRACE, args=(pk,)).apply_async(queue=settings.CELERY_TASK_DEFAULT_QUEUE)
            count += 1
    return count


def read(trace: CustomerTrace) -> bytes:
    """The uploaded trace from the evidence store, hashed again: a trace altered or lost in the store is refused."""
    try:
        return get_bytes(trace.path, trace.sha256)
    except ArtifactMismatch as error:
        raise TraceRefused(_("%(name)s cannot be used: %(error)s") % {"name": trace.name, "error": error}) from None


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
    pending = gate.traces.filter(state__in=(CustomerTrace.State.QUEUED, CustomerTrace.State.ANALYSING)).first()
    if pending is not None:
        raise TraceRefused(_("the trace %(name)s is still being read and analysed (%(percent)d %%); start %(gate)s "
                             "when its analysis is done") % {"name": pending.name, "percent": round(100 * pending.progress),
                                                              "gate": gate.label})
    try:
        allowed = sample_allowed(gate)
    except PlanTamperedError as exc:
        raise TraceRefused(str(exc)) from None
    if allowed:
        return None, None
    raise TraceRefused(_("%(gate)s needs the customer's session trace: upload it on the %(gate)s page or give "
                         "run_gate --trace FILE (the signed plan does not allow a generated sample trace)")
                       % {"gate": gate.label})
