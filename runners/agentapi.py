"""The site agent's API, mounted at /agent/v1/: the only way a site agent reaches the control plane.

GitLab runner's shape: the agent on the customer's jump host dials out, long-polls for its site's work units
(runners.models.AgentCall, queued by runners.agentlink), streams their output back, uploads the files it reads
and reports each one done. Every request carries ``Authorization: Bearer <token>`` (runners.agents); an unknown
or revoked token is refused with 401, and every id that is not of the token's own site answers 404 — never 403,
so nothing tells another site's call exists. Answers are JSON (``{"error": …}`` saying what was wrong), but the
payload of a put. Bodies are at most 1 MiB, but a file's (FXPILOT_AGENT_MAX_FILE), which is streamed to a
temporary file under DATA_DIR/tmp and hashed on its way, never read into memory.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from datetime import timedelta
from functools import wraps
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path, re_path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from infra import wakeup
from runners import agents
from runners.crypto import DecryptionError
from runners.models import AgentCall, Job, Node, OutputChunk, SiteAgent, Step
from runners.sealing import SealError
from runners.ssh import TAIL_BYTES, _OutputSink, _Tail

logger = logging.getLogger(__name__)

MAX_BODY = 1 << 20
MAX_WAIT = 20.0
# A waiting poll looks for its site's calls when the process that queued one says so (infra.wakeup), and at least
# this often otherwise (a word lost, Redis away: the database is the truth).
LOOK_SECONDS = 1.0


def calls_queued(site_id: int) -> str:
    """The word a waiting poll of the site listens for (infra.wakeup)."""
    return f"agent-calls:{site_id}"


def call_answered(call_id: int) -> str:
    """The word the control plane's waiter on a call listens for (runners.agentlink)."""
    return f"agent-call-done:{call_id}"
MAX_SLOTS = 64
CARRY_LIMIT = 64 * 1024  # an unfinished line longer than this is written to the log as it is
TOUCH_EVERY = 5.0  # while a file arrives, the call is touched this often
ERROR_KINDS = ("unreachable", "connection-lost", "timeout", "auth", "host-key-pending", "host-key-changed",
               "invalid", "io")
TERMINAL = (AgentCall.State.DONE, AgentCall.State.CANCELED, AgentCall.State.EXPIRED)


# One agent token may hold at most one open long poll and a few other requests at once (issue 49, item 3): eight
# polls of one token took every gunicorn thread and stalled the portal's pages. A request over the cap is answered
# 429 at once, which the agent treats as "the control plane is busy" and asks again after its back-off
# (runners/agent/client.py). The slots live in the shared cache (Redis in production, so the cap holds across
# gunicorn's processes; the embedded default's local-memory cache counts per process) and expire by themselves, so a
# process killed mid-request cannot hold one for ever.
POLLS_PER_TOKEN = 1
REQUESTS_PER_TOKEN = 8
SLOT_TTL_POLL = int(MAX_WAIT) + 30
SLOT_TTL_REQUEST = 15 * 60   # an upload may take minutes; a slot that outlives its request frees itself


class _Slot:
    """One of `limit` slots of an agent's requests of one kind: taken with cache.add (atomic in both backends)."""

    def __init__(self, agent_id: int, kind: str, limit: int, ttl: int) -> None:
        self.key: str | None = None
        for index in range(limit):
            key = f"agent-slot:{kind}:{agent_id}:{index}"
            if cache.add(key, 1, timeout=ttl):
                self.key = key
                break

    def __enter__(self) -> bool:
        return self.key is not None

    def __exit__(self, *exc) -> None:
        if self.key is not None:
            cache.delete(self.key)


def _error(status: int, message: str, **headers) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _address(request: HttpRequest) -> str:
    """The agent's address as seen here; behind a trusted proxy (FXPILOT_TRUSTED_PROXIES), its last hop."""
    peer = request.META.get("REMOTE_ADDR", "")
    trusted = getattr(settings, "FXPILOT_TRUSTED_PROXIES", ())
    forwarded = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    if peer and peer in trusted and forwarded:
        return forwarded[-1][:64]
    return peer[:64]


def agent_endpoint(*methods: str):
    """CSRF-exempt (no cookies: a bearer token), outside any request transaction, the token checked first."""

    def wrap(view):
        @csrf_exempt
        @transaction.non_atomic_requests
        @wraps(view)
        def endpoint(request: HttpRequest, *args, **kwargs):
            if request.method not in methods:
                return _error(405, f"{request.method} is not allowed here; use {' or '.join(methods)}",
                              Allow=", ".join(methods))
            header = request.META.get("HTTP_AUTHORIZATION", "")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return _error(401, "no agent token: send Authorization: Bearer <token>", WWW_Authenticate="Bearer")
            agent = agents.authenticate(token.strip(), address=_address(request))
            if agent is None:
                return _error(401, "the agent token is unknown or revoked", WWW_Authenticate="Bearer")
            with _Slot(agent.pk, "request", REQUESTS_PER_TOKEN, SLOT_TTL_REQUEST) as held:
                if not held:
                    return _error(429, f"this agent token has {REQUESTS_PER_TOKEN} requests open already; ask again "
                                       "when one has ended", Retry_After="1")
                try:
                    return view(request, agent, *args, **kwargs)
                except _BadRequest as bad:
                    return _error(bad.status, str(bad))

        return endpoint

    return wrap


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        self.status = status
        super().__init__(message)


def _body(request: HttpRequest) -> dict:
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise _BadRequest("Content-Length is not a number") from None
    if length > MAX_BODY:
        raise _BadRequest(f"the body has {length} bytes; at most {MAX_BODY} are accepted here", 413)
    raw = request.read(MAX_BODY + 1) if length else b""
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _BadRequest(f"the body is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _BadRequest("the body must be a JSON object")
    return data


def _number(data: dict, name: str, default: float, low: float, high: float, *, integer: bool = False) -> float:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise _BadRequest(f"{name} must be a number")
    if integer and value != int(value):
        raise _BadRequest(f"{name} must be an integer")
    return min(max(value, low), high)


def _call_of(agent: SiteAgent, call_id: int) -> AgentCall | None:
    """The call, only if it belongs to the agent's own site."""
    return AgentCall.objects.filter(pk=call_id, site_id=agent.site_id).first()


def _no_such_call(call_id: int) -> JsonResponse:
    return _error(404, f"no call {call_id} for this agent")


def _gone(call: AgentCall) -> JsonResponse:
    why = {AgentCall.State.DONE: "is already done", AgentCall.State.CANCELED: "was canceled",
           AgentCall.State.EXPIRED: "expired: the control plane no longer waits for it",
           AgentCall.State.QUEUED: "was not taken"}.get(call.state, f"is {call.state}")
    return _error(410, f"call {call.pk} {why}; stop it")


# --- hello ---------------------------------------------------------------------------------------

@agent_endpoint("POST")
def hello(request: HttpRequest, agent: SiteAgent) -> HttpResponse:
    data = _body(request)
    public_key, version = data.get("public_key"), data.get("version", "")
    if not isinstance(public_key, str) or not public_key:
        raise _BadRequest("public_key (base64 of the agent's X25519 public key) is required")
    if not isinstance(version, str):
        raise _BadRequest("version must be a string")
    try:
        resealed = agents.register_key(agent, public_key, version=version)
    except SealError as exc:
        raise _BadRequest(f"public_key: {exc}") from None
    except agents.KeyConflict as exc:
        return _error(409, str(exc))
    except DecryptionError as exc:
        logger.error("site %s: resealing its credentials for the agent failed: %s", agent.site.name, exc)
        return _error(500, f"the control plane cannot reseal this site's credentials ({exc})")
    if data.get("starting") is True:
        # A process that has just started holds no call: what this token's agent had taken died with its predecessor
        # (a kill, a crash, a reboot). Its waiters hear so now (a transient ConnectionLost: steps re-attach or retry)
        # instead of when the calls fall silent.
        now = timezone.now()
        SiteAgent.objects.filter(pk=agent.pk).update(started_at=now)  # a poll its predecessor left takes no more
        lost = AgentCall.objects.filter(agent=agent, state=AgentCall.State.TAKEN).update(
            state=AgentCall.State.EXPIRED, finished=now, payload=None)
        if lost:
            logger.warning("site agent %s… of site %s restarted: %d call(s) its predecessor held are given up",
                           agent.token_prefix, agent.site.name, lost)
    stale = agent.site.credentials.exclude(sealed_key="").exclude(sealed_to=agent).count()
    logger.info("site agent %s… of site %s said hello (version %s); %d credential(s) sealed to it",
                agent.token_prefix, agent.site.name, agent.version or "?", resealed)
    return JsonResponse({"site": agent.site.name, "site_code": str(agent.site.code), "resealed": resealed,
                         "sealed_to_other_key": stale})


# --- work ----------------------------------------------------------------------------------------

def node_spec(node: Node, site_id: int, *, hops: int = 1) -> dict | None:
    """How the agent reaches a node: its address, the pinned host key and the key sealed to the agent (never a
    key of another site, never one encrypted with the control plane's key)."""
    if node.site_id != site_id:
        return None
    credential = node.credential
    sealed = credential is not None and credential.site_id == site_id and bool(credential.sealed_key)
    accepted = node.host_key_state == Node.HostKeyState.ACCEPTED and node.host_key
    jump = None
    if node.jump_host_id and hops > 0:
        jump = node_spec(node.jump_host, site_id, hops=hops - 1)
    return {"name": node.name, "host": node.host, "port": node.port, "username": node.username,
            "host_key": f"{node.host_key_type} {node.host_key}" if accepted else None,
            "sealed_key": credential.sealed_key if sealed else "",
            "sealed_passphrase": credential.sealed_passphrase if sealed else "",
            "jump": jump}


def _call_json(call: AgentCall) -> dict:
    node = Node.objects.select_related("credential", "jump_host__credential").get(pk=call.node_id)
    return {"id": call.pk, "op": call.op, "node": node_spec(node, call.site_id),
            "args": call.request.get("args", {}), "deadline": call.deadline.timestamp()}


KEEP_FINISHED = timedelta(days=7)  # finished calls (their output is in the job's log) are kept this long
_pruned = {"at": 0.0}


def prune_finished(*, older_than: timedelta = KEEP_FINISHED) -> int:
    """Delete calls finished longer ago than `older_than` (at most once an hour per process)."""
    if time.monotonic() - _pruned["at"] < 3600 and _pruned["at"]:
        return 0
    _pruned["at"] = time.monotonic()
    old = AgentCall.objects.filter(state__in=TERMINAL, finished__lt=timezone.now() - older_than)
    ids = list(old.values_list("pk", flat=True)[:1000])
    return AgentCall.objects.filter(pk__in=ids).delete()[0] if ids else 0


def _expire_overdue(agent: SiteAgent) -> None:
    """Calls of the site whose deadline passed: a queued one was never taken in time, a taken one is no longer
    waited for. Looked up first, so that an idle poll writes nothing."""
    prune_finished()
    now = timezone.now()
    overdue = AgentCall.objects.filter(site_id=agent.site_id, state__in=(AgentCall.State.QUEUED, AgentCall.State.TAKEN),
                                       deadline__lte=now)
    ids = list(overdue.values_list("pk", flat=True)[:500])
    if ids:
        AgentCall.objects.filter(pk__in=ids, state__in=(AgentCall.State.QUEUED, AgentCall.State.TAKEN),
                                 deadline__lte=now).update(state=AgentCall.State.EXPIRED, finished=now, payload=None)
        for call in AgentCall.objects.filter(pk__in=ids, op=AgentCall.Op.GET).only("pk", "result"):
            discard_file(call)


def _take(agent: SiteAgent, slots: int) -> list[dict]:
    taken = []
    candidates = list(AgentCall.objects.filter(site_id=agent.site_id, state=AgentCall.State.QUEUED)
                      .order_by("created", "pk")[:slots])
    for call in candidates:
        now = timezone.now()
        within = call.request.get("answer_within")
        within = float(within) if isinstance(within, (int, float)) and within > 0 else settings.FXPILOT_STEP_DEADLINE_SECONDS
        deadline = now + timedelta(seconds=within)
        # The conditional update is the take: of two agents (or two polls) asking at once, one changes the row.
        won = AgentCall.objects.filter(pk=call.pk, state=AgentCall.State.QUEUED, deadline__gt=now).update(
            state=AgentCall.State.TAKEN, agent=agent, taken_at=now, touched=now, deadline=deadline)
        if won:
            call.state, call.agent, call.taken_at, call.touched, call.deadline = (AgentCall.State.TAKEN, agent, now,
                                                                                 now, deadline)
            taken.append(_call_json(call))
    return taken


@agent_endpoint("POST")
def work(request: HttpRequest, agent: SiteAgent) -> HttpResponse:
    data = _body(request)
    slots = int(_number(data, "slots", 1, 0, MAX_SLOTS, integer=True))
    wait = _number(data, "wait", 0, 0, MAX_WAIT)
    if not agent.public_key:
        return _error(409, "say hello first: the agent's public key is not registered")
    if slots == 0:
        return JsonResponse({"calls": []})
    if wait > 0:
        with _Slot(agent.pk, "poll", POLLS_PER_TOKEN, SLOT_TTL_POLL) as held:
            if not held:
                return _error(429, "this agent token has a poll open already: one open poll per token",
                              Retry_After="1")
            return _work(agent, slots, wait)
    return _work(agent, slots, wait)


def _work(agent: SiteAgent, slots: int, wait: float) -> HttpResponse:
    end = time.monotonic() + wait
    try:
        _expire_overdue(agent)
        while True:
            calls = _take(agent, slots)
            if calls or time.monotonic() >= end:
                break
            wakeup.wait(calls_queued(agent.site_id), min(LOOK_SECONDS, end - time.monotonic()))
            now = SiteAgent.objects.filter(pk=agent.pk).values("revoked_at", "started_at").first() or {}
            if now.get("revoked_at") is not None or not now:
                return _error(401, "the agent token was revoked")
            if now.get("started_at") != agent.started_at:
                # The agent restarted meanwhile: this poll is its dead predecessor's, and a call taken for it would
                # be lost until it fell silent.
                break
    except DatabaseError as exc:
        # The database went away during the wait: the agent asks again (with back-off); a broken connection
        # is not kept for the next request.
        logger.warning("site agent work poll: database error (%s)", type(exc).__name__)
        connection.close_if_unusable_or_obsolete()
        return _error(503, "the control plane's database is not reachable right now; ask again")
    return JsonResponse({"calls": calls})


# --- output and results ----------------------------------------------------------------------------

def _decode_b64(data: dict, name: str) -> bytes:
    value = data.get(name, "")
    if value in ("", None):
        return b""
    if not isinstance(value, str):
        raise _BadRequest(f"{name} must be base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        try:
            return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        except (binascii.Error, ValueError):
            raise _BadRequest(f"{name} is not base64") from None


def _utf8_cut(data: bytes) -> int:
    """The largest prefix length of `data` that does not end inside a UTF-8 character."""
    end = len(data)
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): is its character complete?
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return end if back >= need else end - back
    return end


def _feed(call: AgentCall, chunks: dict[str, bytes], *, final: bool) -> None:
    """Whole lines of new output to the job's live log (runners.ssh's sink: the same chunks a direct command
    writes) and to the call's tails; an unfinished line waits in the row for the next post, or `final`."""
    state = dict(call.output_state or {})
    truncated = set(state.get("truncated", []))
    job = Job(pk=call.job_id) if call.job_id else None
    step = Step(pk=call.step_id, job_id=call.job_id) if call.step_id else None
    sink = _OutputSink(job, step)
    for stream in (OutputChunk.Stream.STDOUT, OutputChunk.Stream.STDERR):
        carry = base64.b64decode(state.get(stream, "") or "")
        buffer = carry + chunks.get(stream, b"")
        if not buffer:
            continue
        if final:
            cut = len(buffer)
        else:
            cut = buffer.rfind(b"\n") + 1
            if cut == 0 and len(buffer) >= CARRY_LIMIT:
                cut = _utf8_cut(buffer)
        out, rest = buffer[:cut], buffer[cut:]
        state[stream] = base64.b64encode(rest).decode() if rest else ""
        if not out:
            continue
        sink.add(stream, out)
        tail = _Tail(TAIL_BYTES)
        attr = f"{stream}_tail"
        tail.add(getattr(call, attr).encode())
        tail.add(out)
        setattr(call, attr, tail.text())
        if tail.truncated:
            truncated.add(stream)
    sink.flush(final=True)
    state["truncated"] = sorted(truncated)
    call.output_state = state


def flush_output(call: AgentCall) -> None:
    """Write what is left of a call's output (an unfinished last line) to its job's log and tails."""
    _feed(call, {}, final=True)
    AgentCall.objects.filter(pk=call.pk).update(output_state=call.output_state, stdout_tail=call.stdout_tail,
                                                stderr_tail=call.stderr_tail)


def _locked_taken(agent: SiteAgent, call_id: int) -> tuple[AgentCall | None, HttpResponse | None]:
    """Inside a transaction: the call of this site, locked, if it is still taken; else the answer to give."""
    call = AgentCall.objects.select_for_update().filter(pk=call_id, site_id=agent.site_id).first()
    if call is None:
        return None, _no_such_call(call_id)
    if call.state != AgentCall.State.TAKEN:
        return None, _gone(call)
    if call.deadline <= timezone.now():
        discard_file(call)
        _feed(call, {}, final=True)
        AgentCall.objects.filter(pk=call.pk, state=AgentCall.State.TAKEN).update(
            state=AgentCall.State.EXPIRED, finished=timezone.now(), payload=None, output_state=call.output_state,
            stdout_tail=call.stdout_tail, stderr_tail=call.stderr_tail)
        call.state = AgentCall.State.EXPIRED
        return None, _gone(call)
    return call, None


@agent_endpoint("POST")
def output(request: HttpRequest, agent: SiteAgent, call_id: int) -> HttpResponse:
    data = _body(request)
    chunks = {"stdout": _decode_b64(data, "stdout"), "stderr": _decode_b64(data, "stderr")}
    with transaction.atomic():
        call, refusal = _locked_taken(agent, call_id)
        if refusal is not None:
            return refusal
        fields = {"touched": timezone.now()}
        if any(chunks.values()):
            _feed(call, chunks, final=False)
            fields.update(output_state=call.output_state, stdout_tail=call.stdout_tail, stderr_tail=call.stderr_tail)
        AgentCall.objects.filter(pk=call.pk).update(**fields)
    cancel = bool(call.job_id) and Job.objects.filter(pk=call.job_id, cancel_requested=True).exists()
    return JsonResponse({"cancel": cancel})


def _done_result(call: AgentCall, data: dict) -> dict:
    # A get's file arrived before its done: what the upload recorded (its name here, its hash and size) stays.
    kept = ("file", "sha256", "size") if call.op == AgentCall.Op.GET else ()
    result = {key: value for key, value in (call.result or {}).items() if key in kept}
    if "error" in data:
        error = data["error"]
        if not isinstance(error, dict):
            raise _BadRequest('error must be an object: {"kind": …, "message": …}')
        kind, message = error.get("kind"), error.get("message", "")
        if kind not in ERROR_KINDS:
            raise _BadRequest(f"error.kind must be one of {', '.join(ERROR_KINDS)}")
        if not isinstance(message, str):
            raise _BadRequest("error.message must be a string")
        failure = {"kind": kind, "message": message[:4000]}
        offered = error.get("offered_key")
        if offered is not None:
            if not isinstance(offered, str) or not re.fullmatch(r"[A-Za-z0-9@.\-]{1,64} [A-Za-z0-9+/=]{16,16384}",
                                                                  offered):
                raise _BadRequest('error.offered_key must be "<type> <base64>"')
            failure["offered_key"] = offered
        where = error.get("node")
        if where is not None:
            if not isinstance(where, str) or len(where) > 100:
                raise _BadRequest("error.node must be the name of the node it happened on")
            failure["node"] = where
        result["error"] = failure
        return result
    if call.op == AgentCall.Op.RUN:
        code = data.get("exit_code")
        if isinstance(code, bool) or not isinstance(code, int):
            raise _BadRequest("exit_code (an integer) is required for a run call")
        result["exit_code"] = code
    elif call.op == AgentCall.Op.PUT:
        digest = data.get("sha256")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise _BadRequest("sha256 (the node's hash of the written file, 64 hex digits) is required for a put call")
        result["sha256"] = digest
    elif call.op == AgentCall.Op.GET and "file" not in result:
        raise _BadRequest(f"no file was uploaded for this get call: PUT its bytes to calls/{call.pk}/file first")
    return result


@agent_endpoint("POST")
def done(request: HttpRequest, agent: SiteAgent, call_id: int) -> HttpResponse:
    data = _body(request)
    with transaction.atomic():
        call, refusal = _locked_taken(agent, call_id)
        if refusal is not None:
            return refusal
        result = _done_result(call, data)
        _feed(call, {}, final=True)
        now = timezone.now()
        AgentCall.objects.filter(pk=call.pk).update(
            state=AgentCall.State.DONE, result=result, finished=now, touched=now, output_state=call.output_state,
            stdout_tail=call.stdout_tail, stderr_tail=call.stderr_tail, payload=None)
        transaction.on_commit(lambda: wakeup.notify(call_answered(call_id)))
    return JsonResponse({"ok": True})


# --- files -----------------------------------------------------------------------------------------

@agent_endpoint("GET")
def payload(request: HttpRequest, agent: SiteAgent, call_id: int) -> HttpResponse:
    call = AgentCall.objects.filter(pk=call_id, site_id=agent.site_id).defer("stdout_tail", "stderr_tail").first()
    if call is None or call.op != AgentCall.Op.PUT:
        return _no_such_call(call_id)
    if call.state != AgentCall.State.TAKEN:
        return _gone(call)
    data = bytes(call.payload or b"")
    response = HttpResponse(data, content_type="application/octet-stream")
    response["X-Content-SHA256"] = hashlib.sha256(data).hexdigest()
    return response


def tmp_dir() -> Path:
    folder = Path(settings.DATA_DIR) / "tmp"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


def received_file(call: AgentCall) -> Path | None:
    """The file an agent uploaded for a get call, once it has arrived whole."""
    name = (call.result or {}).get("file")
    if not isinstance(name, str) or not re.fullmatch(r"agent-call-\d+-[A-Za-z0-9_]+\.part", name):
        return None
    return tmp_dir() / name


def discard_file(call: AgentCall) -> None:
    found = received_file(call)
    if found is not None:
        found.unlink(missing_ok=True)


def _sweep_received(older_than: float = 24 * 3600.0) -> None:
    """Files received for calls nobody collected (their waiter died with its worker) go after a day."""
    limit = time.time() - older_than
    for found in tmp_dir().glob("agent-call-*.part"):
        try:
            if found.stat().st_mtime < limit:
                found.unlink(missing_ok=True)
        except OSError:
            pass


@agent_endpoint("PUT")
def upload(request: HttpRequest, agent: SiteAgent, call_id: int) -> HttpResponse:
    call = AgentCall.objects.filter(pk=call_id, site_id=agent.site_id).only("pk", "op", "state", "site_id").first()
    if call is None or call.op != AgentCall.Op.GET:
        return _no_such_call(call_id)
    if call.state != AgentCall.State.TAKEN:
        return _gone(call)
    limit = settings.FXPILOT_AGENT_MAX_FILE
    raw_length = request.META.get("CONTENT_LENGTH")
    if not raw_length:
        return _error(411, "send the file with a Content-Length (chunked bodies are not accepted)")
    try:
        length = int(raw_length)
    except ValueError:
        raise _BadRequest("Content-Length is not a number") from None
    if length > limit:
        return _error(413, f"the file has {length} bytes; at most {limit} are accepted (FXPILOT_AGENT_MAX_FILE)")
    _sweep_received()
    digest, size = hashlib.sha256(), 0
    handle = tempfile.NamedTemporaryFile(dir=tmp_dir(), prefix=f"agent-call-{call.pk}-", suffix=".part", delete=False)
    target = Path(handle.name)
    try:
        touched = time.monotonic()
        with handle:
            while True:
                chunk = request.read(min(1 << 20, length - size)) if size < length else b""
                if not chunk:
                    break
                size += len(chunk)
                digest.update(chunk)
                handle.write(chunk)
                if time.monotonic() - touched >= TOUCH_EVERY:
                    AgentCall.objects.filter(pk=call.pk, state=AgentCall.State.TAKEN).update(touched=timezone.now())
                    touched = time.monotonic()
            handle.flush()
            os.fsync(handle.fileno())
        if size != length:
            raise _BadRequest(f"the body ended after {size} of {length} bytes")
        with transaction.atomic():
            current = AgentCall.objects.select_for_update().get(pk=call.pk)
            if current.state != AgentCall.State.TAKEN:
                target.unlink(missing_ok=True)
                return _gone(current)
            discard_file(current)  # an earlier try of the same upload
            current.result = {**(current.result or {}), "file": target.name, "sha256": digest.hexdigest(),
                              "size": size}
            AgentCall.objects.filter(pk=call.pk).update(result=current.result, touched=timezone.now())
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return JsonResponse({"sha256": digest.hexdigest(), "size": size})


def unknown(request: HttpRequest, rest: str = "") -> HttpResponse:
    return _error(404, f"no such agent API endpoint: {request.path[:200]}")


urlpatterns = [
    path("hello", hello, name="agent-hello"),
    path("work", work, name="agent-work"),
    path("calls/<int:call_id>/output", output, name="agent-output"),
    path("calls/<int:call_id>/payload", payload, name="agent-payload"),
    path("calls/<int:call_id>/file", upload, name="agent-file"),
    path("calls/<int:call_id>/done", done, name="agent-done"),
    re_path(r"^(?P<rest>.*)$", unknown),
]
