#!/usr/bin/env python3
"""fxpilot workload client: streams OpenAI-compatible completions and records one line per request.

Shipped to GPU nodes and run with whatever `python3` is there (3.8 or newer, standard library only).
Records are `fxpilot.request/1` JSON lines written (and flushed) as each request ends; one
`fxpilot.phase/1` summary line per phase goes to `<records minus .jsonl>.summary.json`
(docs/contracts.md §1, docs/workload-client.md).

    python3 workload.py COMMAND --url http://127.0.0.1:8000 --arm fx --out records/fx.jsonl [options]

Commands (each takes the common options: --model, --run-id, --instance, --simulated, --timeout, --seed,
--session-prefix, --api-key-env, --versions, --coalesce-ms, --quiet, and for tier attribution --lmcache-api URL
(repeatable: every eviction empties those LMCache processes' DRAM) and --disk-device NAME (its sectors read,
from $FXPILOT_DISKSTATS or /proc/diskstats, sampled with every /metrics scrape into the summaries' tier_bytes)):
  populate       each session's context once                    --sessions --prompt-tokens --output-tokens -c
  evict          empty the caches (no records)                  --evict --restart-cmd --health-timeout
  measure        sessions return with a new turn, closed loop   --sessions --prompt-tokens --turn-tokens
                 at each -c level, --repetitions each, evict    --output-tokens -c 8,16,32 --repetitions
                 before every repetition                        --requests-per-client --evict
  cold-recovery  populate → (evict → measure) for every level and repetition, in one process; prints
                 `PROGRESS done/total ok=N` lines for a poller (N: the error-free ones)
  probe          G2 output equivalence: the same prompts at temperature 0 (warm pass, evict, probe pass)
                 --prompts --prompt-tokens --output-tokens --no-warm
  replay         G4 customer trace CSV (session_id,turn,prompt_tokens,output_tokens,arrival_offset_s
                 [,block_ids,stratum]), open loop at the trace's arrival offsets, strictly in the trace's order
                 from one queue (--unordered: a sender per session); with block_ids, prompts are built from
                 content-addressed blocks, salted per repetition so each starts cold   --trace --max-sessions
                 --repetitions --time-scale --block-tokens --max-in-flight --ordered/--unordered
  share          write sessions through --url, read them through --url-b (records of phase `share` carry
                 instance B)                                    --url-b --instance-b
  soak           --duration-s split into --windows (repetition = window number): open loop at --rate
                 requests/s (Poisson, or --arrivals trace), lateness recorded, schedule_kept in the summaries
                 (--max-lateness-s); without --rate (or with --closed-loop) the closed loop of -c clients
  fault          closed loop while the FX path is cut: `measure` before --fault-start, `fault` during
                 --fault-seconds, `recovery` after; runs --cut-cmd / --restore-cmd at those moments

Exit status: 0 done (failed requests are records, not exit codes), 2 bad arguments or bad trace CSV,
3 the server or the eviction could not be used, 143 terminated by SIGTERM (finished requests recorded).
"""
# ruff: noqa: B905, UP041  (runs on Python 3.8: no zip(strict=); asyncio.TimeoutError is not TimeoutError there)
from __future__ import annotations

import argparse
import asyncio
import csv
import functools
import hashlib
import http.client
import json
import math
import os
import random
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any
from urllib.parse import urlsplit

REQUEST_SCHEMA = "fxpilot.request/1"
PHASE_SCHEMA = "fxpilot.phase/1"
PHASES = ("populate", "measure", "probe", "replay", "soak", "fault", "recovery", "share", "capacity")
# Defaults mirror the published test (seed Table 1; gates/plans/default.yaml workloads.*); the
# orchestrator passes the plan's values as flags (plan_args), these are for standalone use.
DEFAULT_SEED = 20260629
DEFAULT_CONCURRENCY = (8, 16, 32)
COLD_RECOVERY = {"prompt_tokens": 65536, "turn_tokens": 256, "output_tokens": 128, "requests_per_client": 2,
                 "repetitions": 3}
PROBE = {"prompts": 8, "prompt_tokens": 4096, "output_tokens": 32}
TOKEN_BASE, TOKEN_SPAN = 1000, 30000  # ids 1000..30999: ordinary tokens in every current vocabulary
DEFAULT_COALESCE_MS = 10.0  # after a stream's first token, read it at most this often (less client CPU)
GPU_COLD_MAX_HIT = 0.05  # same bar as the judge's validity check: above it HBM, not the tier, was measured
METRIC_PREFIXES = ("vllm:prefix_cache_", "vllm:external_prefix_cache_", "vllm:prompt_tokens", "vllm:generation_tokens",
                   "vllm:request_success", "vllm:num_preemptions", "lmcache:", "fxpilot_sim")
SEQUENCED_PHASES = ("replay", "capacity")  # records carry send_seq (the order this client sent them in)
IDENTITY_LABELS = {"model_name", "engine", "pid", "instance", "job", "worker", "rank"}


class WorkloadError(Exception):
    """The run cannot go on (bad arguments, server unusable); exit_code says which."""

    def __init__(self, message: str, exit_code: int = 3):
        super().__init__(message)
        self.exit_code = exit_code


# ── Sessions: deterministic token-id prompts ───────────────────────────────────────────────────────

def token_ids(key: str, count: int) -> list[int]:
    """`count` token ids determined by `key` alone: the same on every node, arm and Python ≥ 3.8."""
    if count <= 0:
        return []
    words = (count + 1) // 2  # whole 32-bit words, so a shorter stream is a prefix of a longer one
    raw = array("H", random.Random(key).getrandbits(32 * words).to_bytes(4 * words, "little"))
    if sys.byteorder != "little":
        raw.byteswap()
    return [TOKEN_BASE + v % TOKEN_SPAN for v in raw[:count]]


def _ids_json(ids: list[int]) -> bytes:
    return ",".join(map(str, ids)).encode()


@dataclass
class Session:
    """One conversation: a fixed context (kept as its JSON fragment, not a list of ints, to save memory)."""

    name: str
    key: str
    context_tokens: int
    context_json: bytes = field(repr=False)

    def context_ids(self) -> list[int]:
        return token_ids(self.key, self.context_tokens)

    def turn_ids(self, label: str, count: int) -> list[int]:
        """A new turn appended when the session returns; `label` makes each return distinct."""
        return token_ids(f"{self.key}:turn:{label}", count)


def make_session(name: str, prompt_tokens: int, seed: int) -> Session:
    key = f"{seed}:{name}"
    return Session(name, key, prompt_tokens, _ids_json(token_ids(key, prompt_tokens)))


def make_sessions(count: int, prompt_tokens: int, seed: int = DEFAULT_SEED, prefix: str = "s") -> list[Session]:
    """`count` sessions named prefix00000…; a session's context depends only on (seed, name, length)."""
    return [make_session(f"{prefix}{i:05d}", prompt_tokens, seed) for i in range(count)]


@dataclass
class PlannedRequest:
    """One request to send. phase None: the phase is decided at send time by the run's labeller."""

    session: str
    prompt_json: bytes
    prompt_tokens: int
    output_tokens: int
    phase: str | None = None
    repetition: int = 1
    concurrency: int = 1
    turn: int | None = None
    url: str | None = None
    instance: str | None = None
    stratum: str | None = None      # replay of a sampled trace: first | shared_prefix | returning
    t_scheduled: float | None = None  # open loop: when it was due (monotonic); records get the lateness
    send_seq: int | None = None     # global 0-based order in which this client process sent its requests


def session_request(session: Session, *, output_tokens: int, turn_tokens: int = 0, turn_label: str = "",
                turn: int | None = None, **kw: Any) -> PlannedRequest:
    prompt = session.context_json
    tokens = session.context_tokens
    if turn_tokens > 0:
        prompt = (prompt + b"," if prompt else b"") + _ids_json(session.turn_ids(turn_label, turn_tokens))
        tokens += turn_tokens
    return PlannedRequest(session.name, prompt, tokens, output_tokens, turn=turn, **kw)


# ── HTTP/1.1 over asyncio: one keep-alive connection per closed-loop client ───────────────────────────

class Endpoint:
    """An OpenAI-compatible server: `http://host:port[/prefix]` (the /v1/... paths are added)."""

    def __init__(self, url: str, api_key: str | None = None):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise WorkloadError(f"--url {url!r}: expected http://host:port (the client speaks plain HTTP)", 2)
        self.url = url.rstrip("/")
        self.host = parts.hostname
        try:
            self.port = parts.port or 80
        except ValueError:
            raise WorkloadError(f"--url {url!r}: the port is not a number", 2) from None
        self.base = parts.path.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.api_key = api_key

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"

    def request_head(self, path: str, length: int) -> bytes:
        auth = f"Authorization: Bearer {self.api_key}\r\n" if self.api_key else ""
        return (f"POST {self.base}{path} HTTP/1.1\r\nHost: {self.name}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\n{auth}Content-Length: {length}\r\n\r\n").encode("latin-1")


class _Raw:
    """What came back for one request, before parsing: bytes, where the chunks are, when each read came."""

    __slots__ = ("status", "reason", "headers", "buf", "head_end", "starts", "lens", "block_end", "block_t",
                 "mode", "error", "t_fail", "complete", "stale", "body", "_cum", "_dec")

    def __init__(self) -> None:
        self.status, self.reason, self.headers = 0, "", {}
        self.buf = bytearray()
        self.head_end = -1
        self.starts: list[int] = []
        self.lens: list[int] = []
        self.block_end: list[int] = []
        self.block_t: list[float] = []
        self.mode = ""
        self.error: str | None = None
        self.t_fail = 0.0
        self.complete = False
        self.stale = False
        self.body = b""
        self._cum: list[int] | None = None
        self._dec: list[int] = []

    def decode(self) -> str | None:
        """Take the body out of its chunked framing; None, or what is wrong with the framing."""
        self._cum = None
        if self.mode != "chunked":
            self.body = bytes(self.buf[self.head_end:])
            return None
        body = bytes(self.buf[self.head_end:])
        # the usual shape (no CR inside chunks): every CRLF is framing, so one split finds them all
        parts = body[:-5].split(b"\r\n") if body.endswith(b"0\r\n\r\n") else [b"x"]
        if len(parts) % 2 == 1 and not parts[-1]:
            datas = parts[1::2]
            try:
                ok = list(map(len, datas)) == list(map(_hex, parts[0:-1:2]))
            except ValueError:
                ok = False
            if ok:
                self.body = b"".join(datas)
                self._cum = list(accumulate(map(len, parts)))
                self._dec = list(accumulate(map(len, datas)))
                return None
        del self.starts[:], self.lens[:]
        status, _ = walk_chunks(self.buf, self.head_end, self.starts, self.lens)
        self.body = b"".join([self.buf[s:s + n] for s, n in zip(self.starts, self.lens)])
        self._dec = list(accumulate(self.lens))
        if status == "more" and self.complete:
            return "malformed chunked encoding: the response ended inside a chunk"
        return None if status in ("end", "more") else status

    def time_at(self, offset: int) -> float:
        """When the byte just before decoded body `offset` arrived."""
        if self.mode == "chunked" and self._dec:
            i = min(bisect_left(self._dec, offset), len(self._dec) - 1)
            if self._cum is not None:  # chunk i's data is part 2i+1, each part followed by CRLF
                data_end = self.head_end + self._cum[2 * i + 1] + 2 * (2 * i + 1)
            else:
                data_end = self.starts[i] + self.lens[i]
            raw = data_end - (self._dec[i] - offset)
        else:
            raw = self.head_end + offset
        j = min(bisect_left(self.block_end, raw), len(self.block_t) - 1)
        return self.block_t[j]


_hex = functools.partial(int, base=16)


def walk_chunks(buf: bytearray, pos: int, starts: list[int], lens: list[int]) -> tuple[str, int]:
    """Chunked framing from `pos`: appends each complete chunk's start and length; returns ('end' at the
    last chunk, 'more' when bytes are missing, else what is wrong) and where it stopped."""
    n, find = len(buf), buf.find
    while True:
        i = find(b"\r\n", pos)
        if i < 0:
            return ("malformed chunked encoding: no chunk-size line" if n - pos > 4096 else "more"), pos
        try:
            size = int(buf[pos:i], 16)
        except ValueError:
            try:  # a chunk extension (`size;name=value`) is allowed and ignored
                size = int(bytes(buf[pos:i]).split(b";", 1)[0], 16)
            except ValueError:
                return f"malformed chunked encoding: chunk size {bytes(buf[pos:i])[:40]!r}", pos
        if not size:
            # else the trailer section is not complete yet
            return ("end" if find(b"\r\n\r\n", i) >= 0 else "more"), pos
        end = i + 2 + size
        if end + 2 > n:
            return "more", pos
        if buf[end:end + 2] != b"\r\n":
            return "malformed chunked encoding: a chunk is longer than its size says", pos
        starts.append(i + 2)
        lens.append(size)
        pos = end + 2


SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; elsewhere the read time alone is used
_ANCILLARY = socket.CMSG_SPACE(16)
_SCRATCH = memoryview(bytearray(262144))  # every read lands here first (one event loop, one reader at a time)
_clock = [0.0, -1.0]  # wall − monotonic, and when it was measured: kernel stamps are wall-clock time


def _kernel_time(ancillary: list, now: float) -> float | None:
    """The kernel's receive time of the last bytes of a read, on the monotonic clock."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            if now - _clock[1] > 1.0:
                _clock[0], _clock[1] = time.time() - time.monotonic(), now
            sec, nsec = struct.unpack("qq", data[:16])
            return sec + nsec * 1e-9 - _clock[0]
    return None


class _Connection:
    """A keep-alive HTTP/1.1 connection carrying one request at a time, read straight from its socket.

    Each read is stamped with the kernel's receive time of its last bytes (SO_TIMESTAMPNS), or the
    read time when that is missing, so a busy or descheduled client does not make tokens look late.
    Work per read is small: stamp, append, recognise the end; parsing happens later. Once the first
    token is in, the later ones are read in batches (at most every `coalesce` seconds, sooner as the
    expected end nears): fewer reads, less CPU, and the kernel stamps keep t_end exact."""

    def __init__(self, sock: socket.socket, coalesce: float = 0.0):
        self.sock, self.fd, self.coalesce = sock, sock.fileno(), coalesce
        self.loop = asyncio.get_running_loop()
        self.closed = self.used = self.reading = False
        self.raw: _Raw | None = None
        self.waiter: asyncio.Future | None = None
        self.timer: asyncio.TimerHandle | None = None
        self._sending: asyncio.Task | None = None
        self._scan, self._keep, self._expect, self._events, self._first_t, self._sent_at = 0, True, 0, 0, 0.0, 0.0
        self._token_seen = False

    @classmethod
    async def open(cls, endpoint: Endpoint, coalesce: float, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        last: Exception = OSError(f"no address for {endpoint.host}")
        for family, kind, proto, _, address in await loop.getaddrinfo(endpoint.host, endpoint.port,
                                                                        type=socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                except OSError:
                    pass
                await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
                return cls(sock, coalesce)
            except (OSError, asyncio.TimeoutError) as error:
                sock.close()
                last = error
        raise last

    def send(self, data: bytes, waiter: asyncio.Future, expect: int) -> None:
        self.raw, self.waiter, self._scan = _Raw(), waiter, 0
        self._expect, self._events, self._token_seen = expect, 0, False
        self._sent_at = time.monotonic()
        self.raw.stale, self.used = self.used, True
        self._read(True)
        self._sending = self.loop.create_task(self.loop.sock_sendall(self.sock, data))
        self._sending.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None and self.raw is not None:
            self._fail(f"sending the request failed: {getattr(error, 'strerror', None) or error}")

    def _read(self, on: bool) -> None:
        if on and not self.reading and not self.closed:
            self.loop.add_reader(self.fd, self._readable)
            self.reading = True
        elif not on and self.reading:
            self.loop.remove_reader(self.fd)
            self.reading = False

    def _readable(self) -> None:
        try:
            # into one preallocated buffer: a fresh 256 KiB bytes object per read costs more than the read
            size, ancillary, _, _ = self.sock.recvmsg_into([_SCRATCH], _ANCILLARY)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._lost(error)
            return
        now = time.monotonic()
        raw = self.raw
        if raw is None:
            self._lost(None if not size else OSError("bytes nobody asked for"))
            return
        if not size:
            self._lost(None)
            return
        kernel = _kernel_time(ancillary, now) if ancillary else None
        t = now if kernel is None or kernel > now else kernel
        floor = raw.block_t[-1] if raw.block_t else self._sent_at  # stamps never go back in time
        if t < floor:
            t = floor
        raw.stale = False
        buf = raw.buf
        buf += _SCRATCH[:size]
        raw.block_end.append(len(buf))
        raw.block_t.append(t)
        if raw.head_end < 0:
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                if len(buf) > 65536:
                    self._fail("the response headers are longer than 64 KiB")
                return
            if not self._head(i):
                return
        if raw.mode == "chunked":
            # the usual end is recognised by its last bytes; the framing is checked when parsed. A CRLF
            # ending that is not the usual one (trailers, CRLF events) is walked chunk by chunk.
            if buf.endswith(b"\r\n0\r\n\r\n") or len(buf) - raw.head_end == 5 and buf.endswith(b"0\r\n\r\n"):
                self._done()
                return
            if buf.endswith(b"\r\n\r\n"):
                status, self._scan = walk_chunks(buf, self._scan, raw.starts, raw.lens)
                if status == "end":
                    self._done()
                    return
                if status != "more":
                    self._fail(status)
                    return
        elif raw.mode == "length" and len(buf) - raw.head_end >= int(raw.headers["content-length"]):
            del buf[raw.head_end + int(raw.headers["content-length"]):]
            self._done()
            return
        if self.coalesce:
            self._pace(size, buf, raw, t)

    def _pace(self, size: int, buf: bytearray, raw: _Raw, t: float) -> None:
        """After the first token, pause reading for a while: up to `coalesce`, less as the end nears."""
        self._events += buf.count(b"data:", len(buf) - size)
        if not self._token_seen:
            self._token_seen = TOKEN_HINT.search(buf, raw.head_end) is not None
            self._first_t = t
            return
        remaining = self._expect - self._events
        if remaining <= 1:
            return
        per_event = (t - self._first_t) / max(self._events - 1, 1)
        pause = min(self.coalesce, 0.5 * remaining * per_event)
        if pause > 0.0002:
            self._read(False)
            self.timer = self.loop.call_later(pause, self._resume)

    def _resume(self) -> None:
        self.timer = None
        if self.raw is not None:
            self._read(True)

    def _head(self, i: int) -> bool:
        raw = self.raw
        lines = bytes(raw.buf[:i]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            self._fail(f"not an HTTP/1.x response: {lines[0][:80]!r}")
            return False
        raw.status, raw.reason = int(parts[1]), (parts[2] if len(parts) > 2 else "")
        for line in lines[1:]:
            name, _, value = line.partition(":")
            raw.headers[name.strip().lower()] = value.strip()
        raw.head_end = self._scan = i + 4
        if "chunked" in raw.headers.get("transfer-encoding", "").lower():
            raw.mode = "chunked"
        elif raw.headers.get("content-length", "").isdigit():
            raw.mode = "length"
        else:
            raw.mode = "close"
        self._keep = not (parts[0] == "HTTP/1.0" or raw.headers.get("connection", "").lower() == "close"
                          or raw.mode == "close")
        return True

    def _done(self) -> None:
        raw, waiter = self.raw, self.waiter
        raw.complete = True
        self.raw = self.waiter = None
        self._read(False)
        # answered before the whole request was sent: the connection cannot carry another one
        if not self._keep or (self._sending is not None and not self._sending.done()):
            self.close()
        if not waiter.done():
            waiter.set_result(raw)

    def _fail(self, reason: str) -> None:
        raw, waiter = self.raw, self.waiter
        self.raw = self.waiter = None
        self.close()
        if raw is not None:
            raw.error, raw.t_fail = raw.error or reason, time.monotonic()
        if waiter is not None and not waiter.done():
            waiter.set_result(raw)

    def timeout(self, seconds: float) -> None:
        self._fail(f"timed out after {seconds:g} s")

    def _lost(self, error: Exception | None) -> None:
        raw = self.raw
        if raw is None:
            self.close()
            return
        if raw.head_end >= 0 and raw.mode == "close":
            self._keep = False
            self._done()
            return
        reason = ("the server closed the connection before answering" if raw.head_end < 0
                  else "the server closed the connection mid-stream")
        if error is not None:
            reason += f" ({error})"
        self._fail(reason)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._read(False)
            if self.timer is not None:
                self.timer.cancel()
            if self._sending is not None and not self._sending.done():
                self._sending.cancel()
                self.loop.remove_writer(self.fd)
            self.sock.close()


class StreamClient:
    """One closed-loop client: reuses its connection while the server keeps it alive."""

    def __init__(self, endpoint: Endpoint, timeout: float, coalesce: float = 0.0):
        self.endpoint, self.timeout, self.coalesce = endpoint, timeout, coalesce
        self.conn: _Connection | None = None

    async def exchange(self, body: bytes, path: str = "/v1/completions", expect: int = 0,
                       sent: asyncio.Future | None = None) -> tuple[float, _Raw]:
        """Send one request; returns (t_send, raw response). Never raises for server misbehaviour. `sent`, when
        given, is resolved as soon as the request is written (or could not be), before the answer comes."""
        try:
            return await self._exchange(body, path, expect, sent)
        finally:
            if sent is not None and not sent.done():
                sent.set_result(None)

    async def _exchange(self, body: bytes, path: str, expect: int,
                        sent: asyncio.Future | None) -> tuple[float, _Raw]:
        loop = asyncio.get_running_loop()
        data = self.endpoint.request_head(path, len(body)) + body
        for attempt in (1, 2):
            t_send = time.monotonic()
            if self.conn is None or self.conn.closed:
                try:
                    self.conn = await _Connection.open(self.endpoint, self.coalesce, min(self.timeout, 60.0))
                except (OSError, asyncio.TimeoutError) as error:
                    raw = _Raw()
                    errno = getattr(error, "errno", None)
                    reason = os.strerror(errno) if errno else (str(error) or "no answer within the timeout")
                    raw.error, raw.t_fail = f"cannot connect to {self.endpoint.name}: {reason}", time.monotonic()
                    self.conn = None
                    return t_send, raw
            waiter = loop.create_future()
            conn = self.conn
            timer = loop.call_later(self.timeout, conn.timeout, self.timeout)
            conn.send(data, waiter, expect)
            if sent is not None and conn._sending is not None:
                conn._sending.add_done_callback(lambda _task: sent.done() or sent.set_result(None))
            raw = await waiter
            timer.cancel()
            # a kept-alive connection the server closed while idle: retry once on a fresh one
            if raw.error and raw.stale and attempt == 1 and raw.head_end < 0 and not raw.buf:
                self.conn = None
                continue
            return t_send, raw
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None


# ── Parsing a finished stream into a record ────────────────────────────────────────────────────────

class StreamError(Exception):
    pass


def sse_payloads(body: bytes) -> list[tuple[int, bytes]]:
    """(decoded offset just after the data, data) for every SSE event; raises StreamError on a line
    that is not an SSE field or a stream that stops inside an event."""
    out: list[tuple[int, bytes]] = []
    if b"\r" not in body:
        pos = 0
        for part in body.split(b"\n\n"):
            end = pos + len(part)
            if part.startswith(b"data: ") and b"\n" not in part:
                out.append((end, part[6:]))
            elif part:
                data = _sse_event(part.split(b"\n"))
                if data is not None:
                    out.append((end, data))
            pos = end + 2
        if body and not body.endswith(b"\n\n") and out and out[-1][0] == len(body):
            raise StreamError("the stream ended inside an SSE event")
        return out
    pos = 0
    for sep in re.finditer(rb"(?:\r\n|\r|\n)(?:\r\n|\r|\n)", body):
        part = body[pos:sep.start()]
        if part:
            data = _sse_event(re.split(rb"\r\n|\r|\n", part))
            if data is not None:
                out.append((sep.start(), data))
        pos = sep.end()
    if body[pos:].strip():
        raise StreamError("the stream ended inside an SSE event")
    return out


def _sse_event(lines: list[bytes]) -> bytes | None:
    data: list[bytes] = []
    for line in lines:
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
        elif not line or line.startswith(b":") or line.split(b":", 1)[0] in (b"event", b"id", b"retry"):
            continue
        else:
            raise StreamError(f"malformed SSE line {line[:80]!r} (expected 'data: ...')")
    return b"\n".join(data) if data else None


@dataclass
class Parsed:
    error: str | None = None
    first: int | None = None  # decoded offset of the first token-bearing event
    last: int | None = None
    tokens: int = 0
    cached: int | None = None
    sha256: str | None = None
    request_id: str | None = None
    done: bool = False
    usage: bool = False      # the stream carried a usage object
    timing: dict | None = None  # the simulated server's modelled delays (its final event's simulated_timing)


STREAM_SHAPE = re.compile(rb"(?:data: \{[^\n]*\}\n\n)+data: \[DONE\]\n\n")
TOKEN_HINT = re.compile(rb'"text":"[^"]|"token_ids":\[\d')
TEXT_RE = re.compile(rb'"text":"((?:[^"\\]|\\.)*)"')
IDS_RE = re.compile(rb'"token_ids":\[([0-9, ]*)\]')


PROMPT_ECHO = b'"prompt_token_ids":['
PROMPT_ECHO_DIGITS = b"0123456789, "


def _without_prompt_echo(event: bytes) -> bytes:
    """The first event with the prompt's echo (`"prompt_token_ids":[…]`, which vLLM sends with `return_token_ids`:
    the whole prompt, hundreds of kilobytes for a long context) written as `null`, so that reading the event's id
    does not decode tens of thousands of numbers nobody reads (≈ 30 ms a request at 64 Ki tokens). Only a plain
    array of numbers is cut; anything else is left to the JSON parser as it is."""
    start = event.find(PROMPT_ECHO)
    if start < 0:
        return event
    opened = start + len(PROMPT_ECHO)
    end = event.find(b"]", opened)
    if end < 0 or event[opened:end].translate(None, PROMPT_ECHO_DIGITS):
        return event
    return event[:opened - 1] + b"null" + event[end + 1:]


def parse_stream(body: bytes) -> Parsed:
    """Token events, usage and errors of an OpenAI completions stream (one choice).

    The common shape (one-line `data: {...}` events, `data: [DONE]` last, no error) is read with a
    few whole-body operations: the first event and the usage event are parsed as JSON, the others
    must each be one line holding one object and their `text` / `token_ids` values are taken by
    pattern (a `"text":"` outside a JSON string is always a key). Anything else takes the slow path,
    which parses every event and names the bad one."""
    if b"\r" in body or b'"error"' in body or not STREAM_SHAPE.fullmatch(body):
        return parse_stream_slow(body)
    texts = TEXT_RE.findall(body)
    if len(texts) != body.count(b'"choices":[{'):
        return parse_stream_slow(body)
    first_end = body.find(b"\n\n")
    usage_at = body.rfind(b'"usage":{')
    try:
        first = json.loads(_without_prompt_echo(body[6:first_end]))
        usage = timing = None
        if usage_at >= 0:
            start = body.rfind(b"\n\ndata: ", 0, usage_at) + 8
            final = json.loads(body[start:body.find(b"\n\n", usage_at)])
            usage, timing = final.get("usage"), final.get("simulated_timing")
        text = json.loads(b'"' + b"".join(texts) + b'"')
        ids_found = IDS_RE.findall(body)
        ids = json.loads(b"[" + b",".join([i for i in ids_found if i.strip()] if b"" in ids_found else ids_found)
                         + b"]") if ids_found else []
    except (ValueError, AttributeError):
        return parse_stream_slow(body)
    if not isinstance(first, dict):
        return parse_stream_slow(body)
    p = Parsed(done=True, timing=timing if isinstance(timing, dict) else None)
    p.request_id = first.get("id") if isinstance(first.get("id"), str) else None
    first_token = TOKEN_HINT.search(body)
    if first_token is not None:
        p.first = first_token.end()
        # the last token sits near the end: look there first
        tail = (list(TOKEN_HINT.finditer(body, max(first_token.start(), len(body) - 4096)))
                or [first_token, *TOKEN_HINT.finditer(body, first_token.end())])
        p.last = tail[-1].end()
    with_ids = bool(ids) and len(ids_found) == len(texts)
    return _conclude(p, usage, len(ids) if with_ids else len(texts) - texts.count(b""), ids if with_ids else None,
                     text)


def _conclude(p: Parsed, usage: Any, tokens: int, ids: list[int] | None, text: str) -> Parsed:
    """The server's usage overrides the tokens counted; the digest is of the token ids when every token
    event carried them, else of the text."""
    if isinstance(usage, dict):
        p.usage = True
        if isinstance(usage.get("completion_tokens"), int):
            tokens = usage["completion_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            p.cached = details["cached_tokens"]
    if p.first is not None:
        p.tokens = tokens
        digest = json.dumps(ids, separators=(",", ":")).encode() if ids else text.encode()
        p.sha256 = hashlib.sha256(digest).hexdigest()
    return p


def parse_stream_slow(body: bytes) -> Parsed:
    """Token events, usage and errors of an OpenAI completions stream (one choice), every event parsed."""
    p = Parsed()
    try:
        events = sse_payloads(body)
    except StreamError as error:
        p.error = str(error)
        events = []
    payloads = [d for _, d in events if d != b"[DONE]"]
    p.done = bool(events) and events[-1][1] == b"[DONE]"
    try:
        objs = json.loads(b"[" + b",".join(payloads) + b"]")
    except ValueError:
        objs = []
        for k, data in enumerate(payloads, 1):
            try:
                objs.append(json.loads(data))
            except ValueError as error:
                p.error = p.error or f"malformed SSE data in event {k}: {data[:80]!r} is not JSON ({error})"
                break
    offsets = [o for o, d in events if d != b"[DONE]"]
    texts: list[str] = []
    ids: list[int] = []
    have_ids, events_with_tokens, usage = True, 0, None
    for k, obj in enumerate(objs):
        if not isinstance(obj, dict):
            p.error = p.error or f"malformed SSE data in event {k + 1}: not a JSON object"
            break
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            message = err.get("message") if isinstance(err, dict) else err
            p.error = p.error or f"the server reported an error mid-stream: {str(message)[:200]}"
            break
        if p.request_id is None and isinstance(obj.get("id"), str):
            p.request_id = obj["id"]
        if obj.get("usage"):
            usage = obj["usage"]
        if isinstance(obj.get("simulated_timing"), dict):
            p.timing = obj["simulated_timing"]
        choices = obj.get("choices")
        if not choices:
            continue
        choice = choices[0]
        text, tids = choice.get("text") or "", choice.get("token_ids")
        if text or tids:
            if p.first is None:
                p.first = offsets[k]
            p.last = offsets[k]
            events_with_tokens += 1
            texts.append(text)
            if tids is None:
                have_ids = False
            else:
                ids.extend(tids)
    with_ids = have_ids and bool(ids)
    return _conclude(p, usage, len(ids) if with_ids else events_with_tokens, ids if with_ids else None,
                     "".join(texts))


def completion_body(model: str, req: PlannedRequest) -> bytes:
    return (b'{"model":' + json.dumps(model).encode() + b',"prompt":[' + req.prompt_json
            + b'],"max_tokens":%d,"temperature":0,"ignore_eos":true,"stream":true,'
            b'"stream_options":{"include_usage":true},"return_token_ids":true}' % req.output_tokens)


def _http_error(raw: _Raw) -> str:
    raw.decode()
    text = raw.body.decode("utf-8", "replace").strip()
    try:
        detail = json.loads(text)
        if isinstance(detail, dict):
            err = detail.get("error", detail)
            text = str(err.get("message", err) if isinstance(err, dict) else err)
    except ValueError:
        pass
    return f"HTTP {raw.status} {raw.reason}".rstrip() + (f": {text[:200]}" if text else "")


def outcome(raw: _Raw, details: bool = True) -> dict:
    """status, error, timestamps and token counts of one finished exchange.

    `details`: the server runs with --enable-prompt-tokens-details (deploy.sh starts vLLM so), so a usage
    without `prompt_tokens_details` means nothing was cached: vLLM 0.20.1 leaves it out on a miss (newer
    versions send 0). The record then says 0, not null, and a miss is not dropped from a hit ratio."""
    out: dict[str, Any] = {"status": "error", "error": None, "t_first_token": None, "t_end": raw.t_fail or None,
                           "output_tokens": 0, "cached_tokens": None, "output_sha256": None, "request_id": None}
    if raw.head_end >= 0 and raw.status != 200:
        out["error"] = _http_error(raw)
        out["t_end"] = out["t_end"] or raw.block_t[-1]
        return out
    if raw.head_end < 0:
        out["error"] = raw.error or "no response"
        if out["error"].startswith("timed out"):
            out["error"] += " before the server answered"
        return out
    ctype = raw.headers.get("content-type", "")
    if "text/event-stream" not in ctype:
        out["error"] = raw.error or f"the server did not stream (Content-Type {ctype or 'missing'})"
        out["t_end"] = out["t_end"] or raw.block_t[-1]
        return out
    framing = raw.decode()
    p = parse_stream(raw.body)
    out["request_id"], out["cached_tokens"], out["output_tokens"] = p.request_id, p.cached, p.tokens
    if p.cached is None and p.usage and details:
        out["cached_tokens"] = 0
    if p.first is not None:
        out["t_first_token"] = raw.time_at(p.first)
        out["output_sha256"] = p.sha256
    if raw.error:
        tokens = f" after {p.tokens} tokens" if p.first is not None else " before any token"
        out["error"] = raw.error + tokens
    elif framing:
        out["error"] = framing
    elif p.error:
        out["error"] = p.error
    elif p.first is None:
        out["error"] = "the stream carried no token"
    elif not p.done:
        out["error"] = f"the stream ended without 'data: [DONE]' after {p.tokens} tokens"
    else:
        out["status"] = "ok"
    if out["status"] == "ok":
        out["t_end"] = raw.time_at(p.last)
        out["simulated_timing"] = p.timing
    elif out["t_end"] is None:
        out["t_end"] = raw.block_t[-1]
    return out


# ── /metrics, eviction, health: short synchronous calls outside the timed windows ──────────────────

def _http(endpoint: Endpoint, method: str, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        conn.request(method, endpoint.base + path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    except http.client.HTTPException as error:  # a broken answer is an I/O failure to every caller
        raise OSError(f"{method} {path}: {type(error).__name__} {error}") from None
    finally:
        conn.close()


def parse_metrics(text: str) -> dict[str, float]:
    """The counters that matter, from Prometheus text: series summed over identity labels (model,
    engine, …); other labels stay in the key, e.g. `vllm:prompt_tokens_by_source_total{source="x"}`."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#" or not line.startswith(METRIC_PREFIXES):
            continue
        name, labels, rest = line, "", ""
        if "{" in line:
            name, _, tail = line.partition("{")
            labels, _, rest = tail.rpartition("}")
        else:
            name, _, rest = line.partition(" ")
        if name.endswith(("_created", "_bucket")):
            continue
        kept = []
        for pair in _split_labels(labels):
            key = pair.split("=", 1)[0].strip()
            if key and key not in IDENTITY_LABELS:
                kept.append(pair.strip())
        value = rest.split()
        try:
            number = float(value[0])
        except (IndexError, ValueError):
            continue
        if not math.isfinite(number):
            continue
        key = name + ("{" + ",".join(sorted(kept)) + "}" if kept else "")
        out[key] = out.get(key, 0.0) + number
    return out


def _split_labels(labels: str) -> list[str]:
    pairs, current, quoted, escaped = [], [], False, False
    for ch in labels:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            pairs.append("".join(current))
            current = []
            continue
        current.append(ch)
    if current:
        pairs.append("".join(current))
    return pairs


def scrape(endpoint: Endpoint) -> tuple[dict[str, float], str | None, str]:
    """(counters, error in words or None, raw text)."""
    try:
        status, body = _http(endpoint, "GET", "/metrics")
    except OSError as error:
        return {}, f"GET /metrics on {endpoint.name} failed: {error}", ""
    if status != 200:
        return {}, f"GET /metrics on {endpoint.name} answered HTTP {status}", ""
    text = body.decode("utf-8", "replace")
    return parse_metrics(text), None, text


def delta(before: dict, after: dict, name: str) -> float | None:
    """Counter increase; a counter that went down was reset by a server restart and counts from 0."""
    if name not in after:
        return None
    start = before.get(name, 0.0)
    return after[name] - start if after[name] >= start else after[name]


def coldness(before: dict, after: dict) -> dict:
    """Was the GPU prefix cache cold during a phase? From /metrics deltas over that phase."""
    prompt = delta(before, after, "vllm:prompt_tokens_total")
    gpu = delta(before, after, "vllm:prefix_cache_hits_total")
    external = delta(before, after, "vllm:external_prefix_cache_hits_total")
    out: dict[str, Any] = {"cold": None, "prompt_tokens": prompt, "gpu_hit_tokens": gpu, "external_hit_tokens": external,
                           "gpu_hit_ratio": None, "external_hit_ratio": None}
    if not prompt or gpu is None:
        out["detail"] = ("cannot verify: /metrics has no vllm:prefix_cache_hits_total or no prompt tokens were counted"
                         if after else "cannot verify: no /metrics from the server")
        return out
    out["gpu_hit_ratio"] = round(gpu / prompt, 6)
    if external is not None:
        out["external_hit_ratio"] = round(external / prompt, 6)
    out["cold"] = gpu / prompt <= GPU_COLD_MAX_HIT
    out["detail"] = (f"GPU prefix cache served {gpu / prompt:.1%} of {prompt:.0f} prompt tokens"
                     + (f", the external tier {external / prompt:.1%}" if external is not None else "")
                     + ("" if out["cold"] else " — the cache is still hot in HBM; eviction did not work"))
    return out


def wait_healthy(endpoint: Endpoint, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            status, _ = _http(endpoint, "GET", "/health", timeout=5.0)
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as error:
            last = str(error)
        time.sleep(0.5)
    raise WorkloadError(f"{endpoint.name} did not become healthy within {timeout:g} s (last: {last})")


def evict(endpoint: Endpoint, methods: Iterable[str], restart_cmd: str | None = None,
          health_timeout: float = 600.0, simulated: bool = False, running: bool = False) -> dict:
    """Empty the caches the measure must not hit. Returns what was done, in words."""
    done: dict[str, str] = {}
    for method in methods:
        if method == "none":
            continue
        if method == "restart":
            if not restart_cmd:
                raise WorkloadError("--evict restart needs --restart-cmd", 2)
            result = subprocess.run(restart_cmd, shell=True, capture_output=True, text=True)
            if result.returncode != 0:
                raise WorkloadError(f"--restart-cmd exited {result.returncode}: {result.stderr.strip()[-300:]}")
            wait_healthy(endpoint, health_timeout)
            done["restart"] = "server restarted and healthy"
        elif method == "reset":
            done["reset"] = reset_prefix_cache(endpoint, running)
        elif method == "drop-caches":
            # a simulated server models its tiers; dropping this machine's page cache would change nothing
            done["drop-caches"] = ("page cache not dropped: simulated server" if simulated else drop_page_cache())
        else:
            raise WorkloadError(f"--evict: unknown method {method!r} (reset, drop-caches, restart, none)", 2)
    return done


RESET_TRIES = 5
RESET_RETRY_S = 1.0


def reset_prefix_cache(endpoint: Endpoint, running: bool = False) -> str:
    """POST /reset_prefix_cache and read the answer: vLLM 0.20.1 answers 200 with an empty body (the reset
    cannot be confirmed there; the measure phase's /metrics coldness check still is), newer versions answer
    `{"success": true|false}` — false, still with HTTP 200, while blocks are held. A refusal is retried a few
    times (blocks free up as requests end), then it is a failed eviction, never a reset. `running`: reset
    while requests are in flight (vLLM preempts them, `reset_running_requests=true`), else a busy server
    refuses — silently in 0.20.1."""
    path = "/reset_prefix_cache" + ("?reset_running_requests=true" if running else "")
    answer = ""
    for attempt in range(1, RESET_TRIES + 1):
        try:
            status, body = _http(endpoint, "POST", path)
        except OSError as error:
            raise WorkloadError(f"POST /reset_prefix_cache on {endpoint.name} failed: {error}") from None
        if status != 200:
            hint = " (the server needs VLLM_SERVER_DEV_MODE=1)" if status in (404, 405) else ""
            raise WorkloadError(f"POST /reset_prefix_cache on {endpoint.name} answered HTTP {status}{hint}")
        answer = body.decode("utf-8", "replace").strip()
        if not answer:
            return "prefix cache reset"
        try:
            data = json.loads(answer)
        except ValueError:
            data = None
        success = data.get("success") if isinstance(data, dict) else None
        if success is True:
            return "prefix cache reset (confirmed by the server)"
        if success is not False:
            raise WorkloadError(f"POST /reset_prefix_cache on {endpoint.name} answered {answer[:200]!r}; expected "
                                "an empty body or {\"success\": true|false}")
        if attempt < RESET_TRIES:
            time.sleep(RESET_RETRY_S)
    raise WorkloadError(f"POST /reset_prefix_cache on {endpoint.name} answered success: false {RESET_TRIES} times "
                        "(the server still holds cached blocks); the prefix cache was not reset")


def drop_page_cache() -> str:
    if os.geteuid() != 0:
        return "page cache NOT dropped: not root (use O_DIRECT in LMCache or run the client as root)"
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as error:
        return f"page cache NOT dropped: {error}"
    return "page cache dropped"


def detect_simulated(endpoint: Endpoint) -> bool:
    """A simulated server says so in /metrics (docs/workload-client.md)."""
    _, error, text = scrape(endpoint)
    return error is None and "simulated" in text.lower()


# ── Tier attribution: LMCache's DRAM emptied, the disk tier's device read counters ──────────────────

DISKSTATS_ENV = "FXPILOT_DISKSTATS"   # simulated nodes point it at a file in /proc/diskstats format
SECTOR_BYTES = 512                    # /proc/diskstats counts 512-byte sectors whatever the device's block size
DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,63}$")
LMCACHE_CLEAR_PATH = "/cache/clear?locations=LocalCPUBackend"
LMCACHE_CLEAR_TIMEOUT_S = 300.0


def diskstats_path() -> str:
    return os.environ.get(DISKSTATS_ENV) or "/proc/diskstats"


def disk_sample(device: str | None) -> dict | None:
    """Sectors read so far by `device` (field 6 of its /proc/diskstats line), stamped on the monotonic clock.
    None without a device; an unreadable file, a missing device or a malformed line is `error` with the reason
    (never a silent zero)."""
    if not device:
        return None
    path = diskstats_path()
    out: dict[str, Any] = {"sectors_read": None, "t": round(time.monotonic(), 6), "error": None}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as error:
        out["error"] = f"cannot read {path}: {error.strerror or error}"
        return out
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if len(fields) >= 3 and fields[2] == device:
            try:
                out["sectors_read"] = int(fields[5])
            except (IndexError, ValueError):
                out["error"] = (f"{path}, line {number}: the sectors-read field (6th) of {device} is "
                                f"{fields[5] if len(fields) > 5 else 'missing'!r}, not a whole number")
            return out
    out["error"] = f"device {device!r} is not in {path} ({len(lines)} lines)"
    return out


def tier_bytes(device: str | None, before: dict | None, after: dict | None) -> dict | None:
    """{device, device_read_bytes (Δ sectors read × 512 over the window), seconds (between the two samples),
    error (None or why the bytes are unknown)}; None when no --disk-device was given."""
    if not device:
        return None
    out: dict[str, Any] = {"device": device, "device_read_bytes": None, "seconds": None, "error": None}
    errors = [s["error"] for s in (before, after) if s and s.get("error")]
    if before is None or after is None:
        errors.append("the device counter was not sampled at both ends of the window")
    if errors:
        out["error"] = "; ".join(dict.fromkeys(errors))
        return out
    out["seconds"] = round(after["t"] - before["t"], 6)
    if after["sectors_read"] < before["sectors_read"]:
        out["error"] = (f"the sectors-read counter of {device} went down ({before['sectors_read']} → "
                        f"{after['sectors_read']}): the device was reset or replaced during the window")
        return out
    out["device_read_bytes"] = (after["sectors_read"] - before["sectors_read"]) * SECTOR_BYTES
    return out


def lmcache_endpoint(url: str) -> Endpoint:
    """An LMCache internal API server, http://host:port (loopback in every deploy)."""
    try:
        return Endpoint(url)
    except WorkloadError:
        raise WorkloadError(f"--lmcache-api {url!r}: expected http://host:port (LMCache's internal API server)",
                            2) from None


def clear_lmcache_dram(urls: Iterable[str]) -> str:
    """`DELETE <url>/cache/clear?locations=LocalCPUBackend` on every LMCache process that owns a cache. A refused
    connection, a non-2xx answer or an answer that reports an error stops the run, naming the URL and the answer:
    a DRAM that may still hold the sessions is never reported as cleared."""
    removed = []
    for url in urls:
        endpoint = lmcache_endpoint(url)
        where = f"DELETE {endpoint.url}{LMCACHE_CLEAR_PATH}"
        try:
            status, body = _http(endpoint, "DELETE", LMCACHE_CLEAR_PATH, timeout=LMCACHE_CLEAR_TIMEOUT_S)
        except OSError as error:
            raise WorkloadError(f"{where} failed: {error}; LMCache's DRAM was not cleared") from None
        text = body.decode("utf-8", "replace").strip()
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None
        if not 200 <= status < 300 or (isinstance(data, dict) and "error" in data):
            raise WorkloadError(f"{where} answered HTTP {status}" + (f": {text[:300]}" if text else "")
                                + "; LMCache's DRAM was not cleared")
        count = data.get("num_removed") if isinstance(data, dict) else None
        removed.append(f"{endpoint.name}: {count if count is not None else '?'} removed")
    return "LMCache DRAM cleared (" + ", ".join(removed) + ")"


# ── Recording ──────────────────────────────────────────────────────────────────────────────────────

def summary_path(out_path: str) -> str:
    return (out_path[:-6] if out_path.endswith(".jsonl") else out_path) + ".summary.json"


class Recorder:
    """Appends records as requests end: one write per line (a crash of this process loses nothing
    finished), fsync at most every second and at close (a crash of the node loses ≤ 1 s)."""

    def __init__(self, out_path: str, progress_total: int = 0, quiet: bool = False):
        folder = os.path.dirname(os.path.abspath(out_path))
        os.makedirs(folder, exist_ok=True)
        self.path, self.summary = out_path, summary_path(out_path)
        self.fd = os.open(out_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.synced = time.monotonic()
        self.done, self.ok, self.total, self.quiet = 0, 0, progress_total, quiet
        self.shown = 0.0
        self.held: list[dict] | None = None
        self.journal_fd: int | None = None

    @property
    def journal(self) -> str:
        """Where held records wait: one file per client process (a copy left by a killed client is never
        overwritten by the next one), not named `.jsonl`, so it is collected as raw evidence, never judged."""
        return (self.path[:-6] if self.path.endswith(".jsonl") else self.path) + f".pending-{os.getpid()}"

    def hold(self) -> None:
        """Keep the next records until release(): a value they carry (a replay's measured concurrency) is known
        only when their window ends. Each is still written at once, to the journal, so a crash loses nothing."""
        self.held = []
        self.journal_fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def release(self, update: Callable[[dict], None] | None = None) -> None:
        """Write the held records (in send order where they carry one) after `update` has filled them in."""
        held, self.held = self.held or [], None
        held.sort(key=lambda r: (r.get("send_seq") is None, r.get("send_seq") or 0))
        for record in held:
            if update is not None:
                update(record)
            os.write(self.fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        os.fsync(self.fd)
        if self.journal_fd is not None:
            os.close(self.journal_fd)
            self.journal_fd = None
            try:
                os.unlink(self.journal)
            except OSError:
                pass

    def write(self, record: dict) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        if self.held is not None:
            self.held.append(record)
            os.write(self.journal_fd, line)
        else:
            os.write(self.fd, line)
        self.done += 1
        self.ok += record.get("status") == "ok"
        now = time.monotonic()
        if now - self.synced >= 1.0:
            os.fsync(self.fd if self.journal_fd is None else self.journal_fd)
            self.synced = now
        if now - self.shown >= 1.0:
            self.progress()

    def progress(self) -> None:
        self.shown = time.monotonic()
        if not self.quiet:
            print(f"PROGRESS {self.done}/{max(self.total, self.done)} ok={self.ok}", flush=True)

    def write_summary(self, summary: dict) -> None:
        os.fsync(self.fd)
        fd = os.open(self.summary, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(summary, separators=(",", ":")) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)


def wall_anchor() -> float:
    """Wall-clock time of monotonic 0, from the tightest of a few bracketed readings."""
    best = None
    for _ in range(5):
        a = time.monotonic()
        w = time.time()
        b = time.monotonic()
        if best is None or b - a < best[0]:
            best = (b - a, w - (a + b) / 2)
    return best[1]


@dataclass
class RunContext:
    """What every record of one client process shares."""

    endpoint: Endpoint
    model: str
    arm: str
    run_id: str
    instance: str
    recorder: Recorder
    simulated: bool
    timeout: float = 3600.0
    anchor: float = field(default_factory=wall_anchor)
    versions: dict | None = None
    quiet: bool = False
    endpoints: dict = field(default_factory=dict)
    coalesce: float = DEFAULT_COALESCE_MS / 1000
    prompt_tokens_details: bool = True
    windows: int = 0
    process: str = field(default_factory=lambda: f"{os.getpid()}-{os.urandom(4).hex()}")
    lmcache_api: list = field(default_factory=list)   # LMCache internal API URLs whose DRAM _evict clears
    disk_device: str | None = None                   # the disk tier's block device, sampled with every scrape
    dram_cleared: bool = False                       # the next window begins with LMCache's DRAM emptied
    sent: int = 0                                    # requests sent so far: the next one's send_seq

    def __post_init__(self) -> None:
        self.finalizer = Finalizer(self)

    def say(self, line: str) -> None:
        if not self.quiet:
            print(line, flush=True)


class PhaseStats:
    """Per phase label: requests, tokens, in-flight high-water mark and time-weighted mean, first send and last
    end; for scheduled sends, how late each went out."""

    def __init__(self) -> None:
        self.requests = self.errors = self.tokens = self.in_flight = self.max_in_flight = 0
        self.t_first, self.t_last = math.inf, -math.inf
        self.area, self.t_change, self.t_open = 0.0, None, None   # ∫ in flight dt since the first send
        self.lateness: list[float] = []
        self.cap_hits = 0

    def change(self, step: int) -> None:
        now = time.monotonic()
        if self.t_change is None:
            self.t_open = now
        else:
            self.area += self.in_flight * (now - self.t_change)
        self.t_change = now
        self.in_flight += step
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight

    def in_flight_summary(self) -> dict:
        """{max, mean}: the mean weighted by time, from the first send to the last end the client saw."""
        span = (self.t_change - self.t_open) if self.t_change is not None else 0.0
        return {"max": self.max_in_flight, "mean": round(self.area / span, 6) if span > 0 else None}


class Finalizer:
    """Turns finished exchanges into records one per event-loop turn, after the clients have sent their
    next requests: parsing never delays reading another stream's first token. The backlog is bounded
    (past `cap` items are finished at once), so records still reach the file within milliseconds."""

    def __init__(self, ctx: RunContext, cap: int = 256):
        self.ctx, self.cap = ctx, cap
        self.queue: deque = deque()
        self.scheduled = False

    def submit(self, item: tuple) -> None:
        self.queue.append(item)
        while len(self.queue) > self.cap:
            self._finish(self.queue.popleft())
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self.scheduled = False
        if self.queue:
            self._finish(self.queue.popleft())
        if self.queue:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._tick)

    def drain(self) -> None:
        while self.queue:
            self._finish(self.queue.popleft())

    def _finish(self, item: tuple) -> None:
        req, phase, st, t_send, raw = item
        ctx = self.ctx
        result = outcome(raw, ctx.prompt_tokens_details)
        record = {
            "schema": REQUEST_SCHEMA, "run_id": ctx.run_id, "arm": ctx.arm, "instance": req.instance or ctx.instance,
            "phase": phase, "concurrency": req.concurrency, "repetition": req.repetition, "session": req.session,
            "turn": req.turn, "prompt_tokens": req.prompt_tokens, "cached_tokens": result["cached_tokens"],
            "output_tokens": result["output_tokens"], "t_send": round(t_send, 6),
            "t_first_token": None if result["t_first_token"] is None else round(result["t_first_token"], 6),
            "t_end": round(result["t_end"] or time.monotonic(), 6), "wall_anchor": round(ctx.anchor, 6),
            "status": result["status"], "error": result["error"], "output_sha256": result["output_sha256"],
            "request_id": result["request_id"], "simulated": ctx.simulated,
        }
        if req.stratum:
            record["stratum"] = req.stratum
        if req.send_seq is not None and phase in SEQUENCED_PHASES:
            record["send_seq"] = req.send_seq
        if req.t_scheduled is not None:
            record["t_scheduled"] = round(req.t_scheduled, 6)
            record["send_lateness_s"] = round(t_send - req.t_scheduled, 6)
        if ctx.simulated and result.get("simulated_timing") is not None:
            simulated_clock(record, result["simulated_timing"])
        ctx.recorder.write(record)
        st.requests += 1
        st.errors += result["status"] != "ok"
        st.tokens += result["output_tokens"]
        st.t_first = min(st.t_first, t_send)
        # The phase's span as this client lived it (its CPU use is measured against it): a simulated record's
        # t_end is on the model clock, which stands still while the simulator runs behind; t_end_wall is not.
        st.t_last = max(st.t_last, record.get("t_end_wall") or record["t_end"])


# A simulated server reports its modelled delays no later than a client can see them; this much of clock
# rounding (server and kernel stamps) is allowed before its report counts as inconsistent.
SIMULATED_CLOCK_TOLERANCE = 0.002


def simulated_clock(record: dict, timing: Any) -> None:
    """A simulated server's record on the simulated node's clock, cross-checked against what was measured.

    The simulator's model clock stands still while it runs behind (its CPU shared with other work), so
    its modelled delays are what the simulated hardware took; what this client measured is that plus
    the simulator's scheduling delays. The record keeps both: t_first_token / t_end become t_send plus
    the modelled delays (clock "simulated"), the measured stamps stay in t_first_token_wall /
    t_end_wall. A report that claims more time than was measured cannot be right: the request is an
    error, saying so. Never used for a real server (it sends no simulated_timing)."""
    measured_first, measured_end = record["t_first_token"], record["t_end"]
    try:
        ttft, e2e = float(timing["ttft_s"]), float(timing["e2e_s"])
    except (KeyError, TypeError, ValueError):
        ttft = e2e = math.nan
    record["t_first_token_wall"], record["t_end_wall"] = measured_first, measured_end
    if (not (math.isfinite(ttft) and math.isfinite(e2e)) or measured_first is None or not 0 <= ttft <= e2e
            or ttft > measured_first - record["t_send"] + SIMULATED_CLOCK_TOLERANCE
            or e2e > measured_end - record["t_send"] + SIMULATED_CLOCK_TOLERANCE):
        record["status"] = "error"
        record["error"] = (f"the simulated server's timing {json.dumps(timing)[:160]} does not fit what was measured "
                           f"(first token after {(measured_first or record['t_send']) - record['t_send']:.6f} s, "
                           f"end after {measured_end - record['t_send']:.6f} s)")
        return
    record["clock"] = "simulated"
    record["t_first_token"] = round(record["t_send"] + ttft, 6)
    record["t_end"] = round(record["t_send"] + e2e, 6)


async def send_one(ctx: RunContext, client: StreamClient, req: PlannedRequest, phase: str, st: PhaseStats,
                   sent: asyncio.Future | None = None) -> None:
    """Send one planned request on `client`; its record is written by the finalizer moments later. `sent` is
    resolved once the request is written (or could not be)."""
    st.change(+1)
    req.send_seq = ctx.sent
    ctx.sent += 1
    t_send, raw = await client.exchange(completion_body(ctx.model, req), expect=req.output_tokens, sent=sent)
    st.change(-1)
    if req.t_scheduled is not None:
        st.lateness.append(t_send - req.t_scheduled)
    ctx.finalizer.submit((req, phase, st, t_send, raw))


def client_for(ctx: RunContext, clients: dict, req: PlannedRequest) -> StreamClient:
    endpoint = ctx.endpoints.get(req.url, ctx.endpoint) if req.url else ctx.endpoint
    client = clients.get(endpoint.url)
    if client is None:
        client = clients[endpoint.url] = StreamClient(endpoint, ctx.timeout, ctx.coalesce)
    return client


def stats_for(stats: dict, phase: str, req: PlannedRequest) -> PhaseStats:
    key = (phase, req.concurrency, req.repetition)
    st = stats.get(key)
    if st is None:
        st = stats[key] = PhaseStats()
    return st


async def closed_loop(ctx: RunContext, reqs: Iterable[PlannedRequest] | Callable[[], PlannedRequest | None], concurrency: int,
                      labeller: Callable[[float], str] | None = None) -> dict[tuple, PhaseStats]:
    """`concurrency` clients each send the next request as soon as their previous one ended; one without a
    phase gets the labeller's phase for the moment it is sent."""
    if callable(reqs):
        take = reqs
    else:
        pending = iter(reqs)

        def take() -> PlannedRequest | None:
            return next(pending, None)
    stats: dict[tuple, PhaseStats] = {}
    clients: list[dict] = [{} for _ in range(concurrency)]

    async def client_loop(mine: dict) -> None:
        while True:
            req = take()
            if req is None:
                return
            phase = req.phase or (labeller(time.monotonic()) if labeller else "measure")
            await send_one(ctx, client_for(ctx, mine, req), req, phase, stats_for(stats, phase, req))

    try:
        await asyncio.gather(*(client_loop(mine) for mine in clients))
    finally:
        ctx.finalizer.drain()
        for mine in clients:
            for client in mine.values():
                client.close()
    return stats


def _summary(ctx: RunContext, phase: str, concurrency: int, repetition: int, st: PhaseStats, cpu: tuple,
             before: dict, after: dict, metric_error: str | None, extra: dict | None = None) -> dict:
    duration = max(st.t_last - st.t_first, 0.0) if st.requests else 0.0
    summary = {
        "schema": PHASE_SCHEMA, "run_id": ctx.run_id, "arm": ctx.arm, "instance": ctx.instance, "phase": phase,
        "concurrency": concurrency, "repetition": repetition, "requests": st.requests, "errors": st.errors,
        "output_tokens": st.tokens, "duration_s": round(duration, 6), "client_cpu_s": round(cpu[0], 6),
        "client_cpu_user_s": round(cpu[1], 6), "client_cpu_sys_s": round(cpu[2], 6),
        "max_in_flight": st.max_in_flight, "wall_anchor": round(ctx.anchor, 6),
        "t_first_send": round(st.t_first, 6) if st.requests else None,
        "t_last_end": round(st.t_last, 6) if st.requests else None,
        "metrics_before": before, "metrics_after": after, "metrics_error": metric_error,
        "prompt_tokens_details": ctx.prompt_tokens_details, "simulated": ctx.simulated,
    }
    if ctx.versions:
        summary["versions"] = ctx.versions
    if extra:
        summary.update(extra)
    return summary


def _cpu() -> tuple[float, float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.process_time(), usage.ru_utime, usage.ru_stime


async def run_requests(ctx: RunContext, reqs: Iterable[PlannedRequest] | Callable[[], PlannedRequest | None], concurrency: int, *,
                   labeller: Callable[[float], str] | None = None, extra: dict | None = None,
                   check_cold: bool = False, endpoint: Endpoint | None = None,
                   phase_metrics: dict | None = None,
                   per_label: Callable[[tuple, PhaseStats], dict] | None = None) -> list[dict]:
    """Run planned requests closed-loop, scrape /metrics around them, write one summary per phase label.
    `phase_metrics`: phase label → {"before", "after"} scrapes taken inside the loop where a label starts or
    ends (a fault run's cut and recovery); the loop's own scrapes close the open ends."""
    target = endpoint or ctx.endpoint
    before, error_before, disk_before = await observe(ctx, target)
    cpu0 = _cpu()
    stats = await closed_loop(ctx, reqs, concurrency, labeller)
    cpu1 = _cpu()
    after, error_after, disk_after = await observe(ctx, target)
    return write_summaries(ctx, stats, tuple(b - a for a, b in zip(cpu0, cpu1)), before, after,
                           error_before or error_after, extra, check_cold, phase_metrics,
                           disk=(disk_before, disk_after), per_label=per_label)


async def observe(ctx: RunContext, endpoint: Endpoint | None = None) -> tuple[dict, str | None, dict | None]:
    """One /metrics scrape and, with --disk-device, the device's read counter sampled right after it:
    (counters, scrape error or None, disk sample or None)."""
    def both() -> tuple[dict, str | None, dict | None]:
        found, error, _ = scrape(endpoint or ctx.endpoint)
        return found, error, disk_sample(ctx.disk_device)
    return await asyncio.get_running_loop().run_in_executor(None, both)


def write_summaries(ctx: RunContext, stats: dict, cpu: tuple, before: dict, after: dict, metric_error: str | None,
                    extra: dict | None = None, check_cold: bool = False,
                    phase_metrics: dict | None = None, disk: tuple = (None, None),
                    per_label: Callable[[tuple, PhaseStats], dict] | None = None) -> list[dict]:
    """One summary per (phase, concurrency, repetition) of one loop. `disk`: the device samples at the loop's two
    scrapes; `phase_metrics` may carry a label's own `disk_before` / `disk_after` beside its scrapes; `per_label`
    adds fields of one label (a soak window's own scrapes and lateness)."""
    summaries = []
    # the CPU of one loop is shared among its phase labels in proportion to their requests
    total = sum(st.requests for st in stats.values()) or 1
    # every summary of this loop shares one pair of /metrics scrapes: the judge compares them with the
    # records of all these cells together (gates/judge/counters.py)
    ctx.windows += 1
    window = f"{ctx.run_id}:{ctx.instance}:{ctx.process}:{ctx.windows}"
    for (phase, conc, rep), st in sorted(stats.items(), key=lambda kv: kv[1].t_first):
        summary = _summary(ctx, phase, conc, rep, st, tuple(c * st.requests / total for c in cpu), before, after,
                           metric_error, extra)
        summary["metrics_window"] = window
        summary["in_flight"] = st.in_flight_summary()
        # true only when this window began right after an eviction that emptied LMCache's DRAM (null: not asked to)
        summary["dram_cleared"] = ctx.dram_cleared if ctx.lmcache_api else None
        summary["tier_bytes"] = tier_bytes(ctx.disk_device, *disk)
        if phase_metrics is not None and phase in phase_metrics:
            bounds = phase_metrics[phase]
            summary["phase_metrics"] = {"before": bounds.get("before", before), "after": bounds.get("after", after)}
            if ctx.disk_device:
                summary["tier_bytes"] = tier_bytes(ctx.disk_device, bounds.get("disk_before", disk[0]),
                                                   bounds.get("disk_after", disk[1]))
        if per_label is not None:
            summary.update(per_label((phase, conc, rep), st))
        if check_cold:
            summary["coldness"] = coldness(before, after)
            cold = summary["coldness"]["cold"]
            # None: /metrics could not say (missing counters, a failed scrape) — never reported as cold
            ctx.say({True: "COLD: ", False: "NOT COLD: ", None: "UNVERIFIED: "}[cold] + summary["coldness"]["detail"])
        ctx.recorder.write_summary(summary)
        summaries.append(summary)
    ctx.dram_cleared = False  # what ran since the eviction has put sessions in DRAM again
    ctx.recorder.progress()
    return summaries


# ── Workloads ──────────────────────────────────────────────────────────────────────────────────────

def populate_requests(sessions: list[Session], output_tokens: int, concurrency: int, repetition: int = 1,
                  **kw: Any) -> list[PlannedRequest]:
    return [session_request(s, output_tokens=output_tokens, phase="populate", concurrency=concurrency,
                        repetition=repetition, turn=1, **kw) for s in sessions]


def measure_requests(sessions: list[Session], *, output_tokens: int, turn_tokens: int, concurrency: int,
                 repetition: int, phase: str = "measure", **kw: Any) -> list[PlannedRequest]:
    return [session_request(s, output_tokens=output_tokens, turn_tokens=turn_tokens,
                        turn_label=f"{phase}:{concurrency}:{repetition}", phase=phase, concurrency=concurrency,
                        repetition=repetition, turn=2, **kw) for s in sessions]


def run_phase(url: str, *, model: str, arm: str, phase: str, concurrency: int, repetition: int,
              sessions: list[Session], output_tokens: int, run_id: str, instance: str, out_path: str,
              simulated: bool | None = None, turn_tokens: int = 0, timeout: float = 3600.0,
              api_key: str | None = None, quiet: bool = True) -> dict:
    """One closed-loop phase at `concurrency` over `sessions` (each once); returns its summary.
    populate sends each context alone; other phases append a new turn of `turn_tokens`."""
    if phase not in PHASES:
        raise WorkloadError(f"phase {phase!r}: expected one of {', '.join(PHASES)}", 2)
    endpoint = Endpoint(url, api_key)
    recorder = Recorder(out_path, len(sessions), quiet)
    try:
        ctx = RunContext(endpoint, model, arm, run_id, instance, recorder,
                         detect_simulated(endpoint) if simulated is None else simulated, timeout, quiet=quiet)
        if phase == "populate":
            reqs = populate_requests(sessions, output_tokens, concurrency, repetition)
        else:
            reqs = measure_requests(sessions, output_tokens=output_tokens, turn_tokens=turn_tokens,
                                concurrency=concurrency, repetition=repetition, phase=phase)
        return asyncio.run(run_requests(ctx, reqs, concurrency))[0]
    finally:
        recorder.close()


async def _evict(ctx: RunContext, a: argparse.Namespace) -> dict:
    """The eviction before a cold window: the --evict methods, then (with --lmcache-api) LMCache's DRAM emptied
    on every process that owns a cache — after vLLM's prefix-cache reset, so nothing HBM still held goes back."""
    loop = asyncio.get_running_loop()
    done = await loop.run_in_executor(None, evict, ctx.endpoint, a.evict, a.restart_cmd, a.health_timeout,
                                      ctx.simulated)
    ctx.dram_cleared = False
    if ctx.lmcache_api:
        done["lmcache-dram"] = await loop.run_in_executor(None, clear_lmcache_dram, ctx.lmcache_api)
        ctx.dram_cleared = True
    ctx.say("EVICT " + ("; ".join(done.values()) or "nothing (--evict none)"))
    return done


def cold_recovery_plan(a: argparse.Namespace) -> tuple[int, list[tuple[int, int, int]]]:
    """(sessions per repetition, [(concurrency, repetition, sessions measured)]), repetition by repetition."""
    count = a.sessions or max(a.concurrency) * a.requests_per_client
    first = getattr(a, "first_repetition", 1)  # > 1 when a run continues to its next planned look
    cells = [(c, r, min(count, c * a.requests_per_client)) for r in range(first, first + a.repetitions)
             for c in a.concurrency]
    return count, cells


def repetition_sessions(a: argparse.Namespace, count: int, repetition: int) -> list[Session]:
    """Fresh sessions for every repetition (judge version 3: the session is the unit of a hit ratio): a session
    whose chunks never reach the tier would otherwise miss in every repetition and its misses would look like
    agreement. Named <prefix>r<repetition>-<n>, so repetitions never share a session."""
    return make_sessions(count, a.prompt_tokens, a.seed, f"{a.session_prefix or 's'}r{repetition}-")


async def cmd_cold_recovery(ctx: RunContext, a: argparse.Namespace, populate: bool = True,
                            measure: bool = True) -> None:
    """populate writes the first repetition's sessions; measure writes each later repetition's own fresh
    sessions (phase populate) before its eviction, then measures every level of that repetition."""
    count, cells = cold_recovery_plan(a)
    reps = sorted({r for _, r, _ in cells})
    ctx.recorder.total = (count if populate else 0) + (
        sum(n for _, _, n in cells) + count * (len(reps) - 1) if measure else 0)
    conc = a.populate_concurrency or max(a.concurrency)
    if populate:
        ctx.say(f"PHASE populate sessions={count} prompt_tokens={a.prompt_tokens} concurrency={conc} "
                f"repetition={reps[0]}")
        await run_requests(ctx, populate_requests(repetition_sessions(a, count, reps[0]), a.output_tokens, conc,
                                                  reps[0]), conc)
    if not measure:
        return
    for rep in reps:
        sessions = repetition_sessions(a, count, rep)
        if rep != reps[0]:
            ctx.say(f"PHASE populate sessions={count} prompt_tokens={a.prompt_tokens} concurrency={conc} "
                    f"repetition={rep}")
            await run_requests(ctx, populate_requests(sessions, a.output_tokens, conc, rep), conc)
        for level, _, n in (cell for cell in cells if cell[1] == rep):
            done = await _evict(ctx, a)
            ctx.say(f"PHASE measure concurrency={level} repetition={rep} sessions={n}")
            reqs = measure_requests(sessions[:n], output_tokens=a.output_tokens, turn_tokens=a.turn_tokens,
                                    concurrency=level, repetition=rep)
            await run_requests(ctx, reqs, level, extra={"eviction": done}, check_cold=True)


async def cmd_evict(ctx: RunContext, a: argparse.Namespace) -> None:
    print(json.dumps({"eviction": await _evict(ctx, a)}), flush=True)


async def cmd_probe(ctx: RunContext, a: argparse.Namespace) -> None:
    """The same prompts on every arm at temperature 0: a warm pass writes them to the cache, an
    eviction empties HBM, the probe pass reads them back; the judge compares output_sha256."""
    sessions = make_sessions(a.prompts, a.prompt_tokens, a.seed, a.session_prefix or "probe")
    conc = a.concurrency[0]
    ctx.recorder.total = len(sessions) * (1 if a.no_warm else 2)
    if not a.no_warm:
        ctx.say(f"PHASE populate (warm) prompts={len(sessions)}")
        await run_requests(ctx, populate_requests(sessions, a.output_tokens, conc), conc)
        done = await _evict(ctx, a)
    else:
        done = {}
    ctx.say(f"PHASE probe prompts={len(sessions)}")
    reqs = [session_request(s, output_tokens=a.output_tokens, phase="probe", concurrency=conc, turn=1) for s in sessions]
    await run_requests(ctx, reqs, conc, extra={"eviction": done}, check_cold=not a.no_warm)


async def cmd_share(ctx: RunContext, a: argparse.Namespace) -> None:
    """Write sessions through instance A, then read them (new turn appended) through instance B."""
    if not a.url_b:
        raise WorkloadError("share needs --url-b (the second instance)", 2)
    b = Endpoint(a.url_b, ctx.endpoint.api_key)
    ctx.endpoints[b.url] = b
    instance_b = a.instance_b or b.name
    sessions = make_sessions(a.sessions or 16, a.prompt_tokens, a.seed, a.session_prefix or "share")
    conc = a.concurrency[0]
    ctx.recorder.total = 2 * len(sessions)
    ctx.say(f"PHASE populate on {ctx.instance} sessions={len(sessions)}")
    await run_requests(ctx, populate_requests(sessions, a.output_tokens, conc), conc)
    ctx.say(f"PHASE share on {instance_b}")
    reqs = measure_requests(sessions, output_tokens=a.output_tokens, turn_tokens=a.turn_tokens, concurrency=conc,
                        repetition=1, phase="share", url=b.url, instance=instance_b)
    saved = ctx.instance
    ctx.instance = instance_b
    try:
        await run_requests(ctx, reqs, conc, endpoint=b, check_cold=True)
    finally:
        ctx.instance = saved


def _cycling_requests(ctx: RunContext, sessions: list[Session], a: argparse.Namespace, conc: int,
                  deadline: float, repetition: Callable[[float], int],
                  more: Callable[[float, int], bool] | None = None) -> Callable[[], PlannedRequest | None]:
    """Sessions in turn, each return with a fresh new turn, until `deadline` (monotonic); past it, for as long as
    `more(now, requests sent)` says so."""
    counter = [0]

    def take() -> PlannedRequest | None:
        now = time.monotonic()
        if now >= deadline and not (more and more(now, counter[0])):
            return None
        n = counter[0]
        counter[0] += 1
        session = sessions[n % len(sessions)]
        visit = n // len(sessions)
        return session_request(session, output_tokens=a.output_tokens, turn_tokens=a.turn_tokens if visit else 0,
                           turn_label=f"visit:{visit}", concurrency=conc, repetition=repetition(now), turn=visit + 1)
    return take


SOAK_POOL_OVER_HBM = 1.25
"""The soak's session pool holds this many times the tokens the server's HBM prefix cache holds (below)."""


def hbm_tokens(text: str) -> int | None:
    """Tokens of KV cache the server keeps in HBM, from vLLM's `vllm:cache_config_info` gauge in /metrics
    (num_gpu_blocks × block_size, labels of an info gauge set to 1); None when the server does not say."""
    for line in text.splitlines():
        if not line.startswith("vllm:cache_config_info{"):
            continue
        labels = {}
        for pair in _split_labels(line.partition("{")[2].rpartition("}")[0]):
            key, _, value = pair.partition("=")
            labels[key.strip()] = value.strip().strip('"')
        try:
            blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
        except (KeyError, ValueError):
            return None
        return blocks * size if blocks > 0 and size > 0 else None
    return None


def soak_pool(conc: int, prompt_tokens: int, hbm: int | None, dram: int = 0) -> int:
    """Sessions the soak cycles over: at least two per client, and more than the server's HBM holds. A pool that
    fits in HBM is answered from HBM after its first visits and never reaches the tier the soak is about (the
    default plan's 32 sessions of 64 Ki tokens are 2.1 M tokens; one MI308X node keeps 6.35 M): the soak would
    judge HBM, and its windows would differ by how the HBM hits happened to batch, not by the tier. Cycling over
    more than HBM holds, every visit after the first misses HBM (least recently used goes first, and the pool is
    visited in order) and comes from the tier, in every window alike."""
    pool = 2 * conc
    above = (hbm or 0) + (dram or 0)  # LMCache's DRAM (--dram-tokens) sits above the tier too
    if above:
        pool = max(pool, math.ceil(SOAK_POOL_OVER_HBM * above / max(prompt_tokens, 1)))
    return pool


async def cmd_soak(ctx: RunContext, a: argparse.Namespace) -> None:
    """Closed loop for --duration-s; repetition = the window the request was sent in. Without --sessions the pool
    is sized above the server's HBM (soak_pool). With --min-requests a soak that ends its length short of the
    error-free requests its failure-rate bar needs (ended or in flight) sends on into its last window until it has
    them, for at most its length again: a soak sized on a machine that then got busier still decides its bar."""
    if a.duration_s <= 0 or a.windows < 1:
        raise WorkloadError("soak needs --duration-s > 0 and --windows ≥ 1", 2)
    if a.rate:
        await cmd_soak_open(ctx, a)
        return
    conc = a.concurrency[0]
    sessions, count, hbm = await _soak_sessions(ctx, a, conc)
    start = time.monotonic()
    width = a.duration_s / a.windows
    ctx.say(f"PHASE soak duration={a.duration_s:g}s windows={a.windows} concurrency={conc} sessions={count}"
            + (f" hbm_tokens={hbm}" if hbm else ""))
    done0, ok0, said = ctx.recorder.done, ctx.recorder.ok, []
    extra: dict = {"soak_sessions": count, "hbm_tokens": hbm, "dram_tokens": a.dram_tokens or None,
                   "min_requests": a.min_requests or None,
                   "open_loop": False}

    def more(now: float, sent: int) -> bool:
        ok, in_flight = ctx.recorder.ok - ok0, sent - (ctx.recorder.done - done0)
        return _soak_more(ctx, a, start, now, ok, in_flight, said, extra)

    take = _cycling_requests(ctx, sessions, a, conc, start + a.duration_s,
                             lambda now: min(a.windows, int((now - start) // width) + 1), more)
    await run_requests(ctx, take, conc, labeller=lambda now: "soak", extra=extra)


def _soak_more(ctx: RunContext, a: argparse.Namespace, start: float, now: float, ok: int, in_flight: int,
               said: list, extra: dict) -> bool:
    """Past its length, does the soak send on to reach its floor (--min-requests)? Error-free requests ended plus
    those in flight count; never past twice its length."""
    if not a.min_requests or now >= start + 2 * a.duration_s or ok + in_flight >= a.min_requests:
        return False
    if not said:
        said.append(ok)
        extra["extended_with_ok"] = ok  # the summary says the soak ran past its length, and from how many
        ctx.say(f"PHASE soak extended: {ok} error-free requests of the {a.min_requests} its failure-rate bar needs "
                f"after {a.duration_s:g}s; sending on into window {a.windows} for at most {a.duration_s:g}s more")
    return True


async def _soak_sessions(ctx: RunContext, a: argparse.Namespace, conc: int) -> tuple[list[Session], int, int | None]:
    """The sessions a soak cycles over (--sessions, else sized above the server's HBM and, with --dram-tokens,
    LMCache's DRAM: soak_pool)."""
    hbm = None
    if not a.sessions:
        _, error, text = await asyncio.get_running_loop().run_in_executor(None, scrape, ctx.endpoint)
        hbm = hbm_tokens(text) if error is None else None
        if hbm is None:
            ctx.say(f"NOTE the server does not report its HBM KV capacity (vllm:cache_config_info): the soak cycles over "
                    f"{2 * conc} sessions, which its HBM may hold")
    count = a.sessions or soak_pool(conc, a.prompt_tokens, hbm, getattr(a, "dram_tokens", 0))
    return make_sessions(count, a.prompt_tokens, a.seed, a.session_prefix or "soak"), count, hbm


SOAK_CAP_PER_CLIENT, SOAK_CAP_MIN = 16, 64
"""An open-loop soak's in-flight cap (--max-in-flight 0): 16 × its concurrency, at least 64 — far above what a
server that keeps up holds at the planned rate; reaching it is recorded (cap_hits) and shows as lateness."""
SOAK_LATENESS_MAX_S = 1.0
"""The default bound on the soak's send lateness p99: one mean inter-arrival time (1 / rate), at most this."""


def soak_cap(a: argparse.Namespace) -> int:
    return a.max_in_flight or max(SOAK_CAP_MIN, SOAK_CAP_PER_CLIENT * a.concurrency[0])


def lateness_bound(a: argparse.Namespace) -> float:
    """--max-lateness-s, else one mean inter-arrival time (1 / --rate), at most SOAK_LATENESS_MAX_S."""
    if a.max_lateness_s is not None:
        return float(a.max_lateness_s)
    return min(SOAK_LATENESS_MAX_S, 1.0 / a.rate)


def arrival_gaps(a: argparse.Namespace, turns: list[TraceTurn] | None = None) -> Callable[[], float]:
    """Seconds to the next arrival at --rate: exponential (Poisson arrivals, seeded by --seed) or the trace's own
    inter-arrival gaps in its order, scaled so that their mean is 1 / rate, cycled."""
    if a.arrivals == "poisson":
        rng = random.Random(f"{a.seed}:soak-arrivals")
        return functools.partial(rng.expovariate, a.rate)
    offsets = sorted(t.arrival_offset_s for t in turns or [])
    gaps = [later - earlier for earlier, later in zip(offsets, offsets[1:])]
    if not gaps or sum(gaps) <= 0:
        raise WorkloadError(f"--arrivals trace: {a.trace} needs at least two different arrival offsets to give "
                            "the soak an arrival shape", 2)
    scale = len(gaps) / (sum(gaps) * a.rate)
    scaled = [g * scale for g in gaps]
    position = [0]

    def gap() -> float:
        value = scaled[position[0] % len(scaled)]
        position[0] += 1
        return value
    return gap


class InFlight:
    """Requests in flight over time, per window: the most at once and the time-weighted mean."""

    def __init__(self) -> None:
        self.now, self.t, self.area, self.top = 0, time.monotonic(), 0.0, 0
        self.windows: dict[int, dict] = {}

    def change(self, step: int) -> None:
        t = time.monotonic()
        self.area += self.now * (t - self.t)
        self.t, self.now = t, self.now + step
        self.top = max(self.top, self.now)

    def close(self, window: int, opened: tuple[float, float]) -> tuple[float, float]:
        """End `window` (opened at (t, area)); returns the next window's opening."""
        self.change(0)
        span = self.t - opened[0]
        self.windows[window] = {"max": self.top, "mean": round((self.area - opened[1]) / span, 6) if span > 0 else None}
        self.top = self.now
        return self.t, self.area


async def cmd_soak_open(ctx: RunContext, a: argparse.Namespace) -> None:
    """Open loop at --rate requests/s for --duration-s in --windows windows (repetition = the window of the
    request's scheduled time). Arrivals are Poisson (or the trace's shape, --arrivals trace) from a seeded RNG;
    a send never waits for an earlier answer, only for a free slot under the in-flight cap (soak_cap), and each
    record carries when it was due (t_scheduled) and how late it went (send_lateness_s), so its latency can be
    taken from its schedule. /metrics (and the device counter) are read at every window boundary: each window's
    summary has its own pair (phase_metrics, tier_bytes, window_seconds), its lateness and cap hits, and the
    soak's verdict on its own client: schedule_kept is false when the lateness p99 over the soak exceeds
    lateness_bound (the judge then marks the soak invalid). The floor (--min-requests) works as in the closed
    loop: past its length the soak keeps its rate into the last window until it has them."""
    conc, cap, bound = a.concurrency[0], soak_cap(a), lateness_bound(a)
    gap = arrival_gaps(a, getattr(a, "trace_turns", None))
    sessions, count, hbm = await _soak_sessions(ctx, a, conc)
    width = a.duration_s / a.windows
    ctx.say(f"PHASE soak open loop at {a.rate:g} requests/s ({a.arrivals} arrivals) duration={a.duration_s:g}s "
            f"windows={a.windows} sessions={count} in_flight_cap={cap} max_lateness_s={bound:g}"
            + (f" hbm_tokens={hbm}" if hbm else ""))
    extra: dict = {"soak_sessions": count, "hbm_tokens": hbm, "dram_tokens": a.dram_tokens or None,
                   "min_requests": a.min_requests or None,
                   "open_loop": True, "rate_per_s": a.rate, "arrivals": a.arrivals, "in_flight_cap": cap}
    stats: dict[tuple, PhaseStats] = {}
    marks: dict[int, tuple] = {1: await observe(ctx)}
    flight = InFlight()
    opened: dict[int, tuple[float, float]] = {}
    idle: list[StreamClient] = []
    clients: list[StreamClient] = []
    running: set[asyncio.Future] = set()
    freed = asyncio.Event()
    done0, ok0, said = ctx.recorder.done, ctx.recorder.ok, []
    start = time.monotonic()
    opened[1] = (start, 0.0)
    flight.t = start
    cpu0 = _cpu()

    async def boundaries() -> None:
        for k in range(2, a.windows + 1):
            await sleep_until(start + (k - 1) * width)
            opened[k] = flight.close(k - 1, opened[k - 1])
            marks[k] = await observe(ctx)

    async def one(req: PlannedRequest, client: StreamClient, st: PhaseStats) -> None:
        try:
            await send_one(ctx, client, req, "soak", st)
        finally:
            flight.change(-1)
            idle.append(client)
            freed.set()

    watcher = asyncio.ensure_future(boundaries())
    n, due = 0, start
    try:
        while True:
            due += gap()
            if due >= start + a.duration_s:
                if not a.min_requests:
                    await sleep_until(start + a.duration_s)  # the last window lasts its time, sends or not
                    break
                await sleep_until(due)
                ok, in_flight = ctx.recorder.ok - ok0, n - (ctx.recorder.done - done0)
                if not _soak_more(ctx, a, start, time.monotonic(), ok, in_flight, said, extra):
                    break
            await sleep_until(due)
            session = sessions[n % len(sessions)]
            visit = n // len(sessions)
            req = session_request(session, output_tokens=a.output_tokens, turn_tokens=a.turn_tokens if visit else 0,
                                  turn_label=f"visit:{visit}", concurrency=conc,
                                  repetition=min(a.windows, int((due - start) // width) + 1), turn=visit + 1)
            req.t_scheduled = due
            st = stats_for(stats, "soak", req)
            if flight.now >= cap:
                st.cap_hits += 1
                while flight.now >= cap:
                    freed.clear()
                    await freed.wait()
            client = idle.pop() if idle else None
            if client is None:
                client = StreamClient(ctx.endpoint, ctx.timeout, ctx.coalesce)
                clients.append(client)
            flight.change(+1)  # counted here, not when the task first runs: the next look at the cap sees it
            task = asyncio.ensure_future(one(req, client, st))
            running.add(task)
            task.add_done_callback(running.discard)
            n += 1
        if running:
            await asyncio.gather(*running)
        await watcher
    finally:
        ctx.finalizer.drain()
        if not watcher.done():
            watcher.cancel()
        for task in list(running):
            task.cancel()
        for client in clients:
            client.close()
    cpu1 = _cpu()
    last = max(opened)
    flight.close(last, opened[last])
    after = await observe(ctx)
    lateness = [v for st in stats.values() for v in st.lateness]
    overall = lateness_summary(lateness)
    kept = overall["p99"] is None or overall["p99"] <= bound
    extra["schedule_kept"] = kept
    extra["schedule"] = {"max_lateness_s": bound, "lateness_p99_s": overall["p99"], "lateness_max_s": overall["max"],
                         "requests": overall["count"], "cap_hits": sum(st.cap_hits for st in stats.values())}
    ctx.say(f"SCHEDULE {'kept' if kept else 'NOT KEPT'}: {overall['count']} requests at {a.rate:g}/s, send lateness "
            f"p99 {overall['p99'] if overall['p99'] is not None else 0:.4f} s (bound {bound:g} s), max "
            f"{overall['max'] if overall['max'] is not None else 0:.4f} s, {extra['schedule']['cap_hits']} sends held "
            f"at the in-flight cap {cap}")

    def window(key: tuple, st: PhaseStats) -> dict:
        w = key[2]
        begin, end = marks.get(w), marks.get(w + 1, after)
        out: dict[str, Any] = {"lateness_s": lateness_summary(st.lateness), "cap_hits": st.cap_hits,
                               "in_flight": flight.windows.get(w, st.in_flight_summary())}
        if begin is None:
            return out
        out["phase_metrics"] = {"before": begin[0], "after": end[0]}
        out["window_seconds"] = round((opened[w + 1][0] if w + 1 in opened else flight.t) - opened[w][0], 6)
        if begin[1] or end[1]:
            out["window_metrics_error"] = begin[1] or end[1]
        if ctx.disk_device:
            out["tier_bytes"] = tier_bytes(ctx.disk_device, begin[2], end[2])
        return out

    write_summaries(ctx, stats, tuple(y - x for x, y in zip(cpu0, cpu1)), marks[1][0], after[0],
                    marks[1][1] or after[1], extra, disk=(marks[1][2], after[2]), per_label=window)


async def cmd_fault(ctx: RunContext, a: argparse.Namespace) -> None:
    """Load runs while the FX path is cut: `measure` before the cut, `fault` during, `recovery` after."""
    conc = a.concurrency[0]
    sessions = make_sessions(a.sessions or 2 * conc, a.prompt_tokens, a.seed, a.session_prefix or "fault")
    ctx.recorder.total = len(sessions)
    ctx.say(f"PHASE populate sessions={len(sessions)}")
    await run_requests(ctx, populate_requests(sessions, a.output_tokens, conc), conc)
    await _evict(ctx, a)
    duration = a.duration_s or a.fault_start + 2 * a.fault_seconds  # recovery as long as the cut
    start = time.monotonic()
    cut, back = start + a.fault_start, start + a.fault_start + a.fault_seconds
    events: dict[str, Any] = {}
    loop = asyncio.get_running_loop()
    # /metrics at the cut and once the restored path is evicted: the recovery's own external-tier hits (the
    # judge's g4-fault-recovery), apart from HBM hits and from what the loop counted before
    bounds: dict[str, dict] = {"measure": {}, "fault": {}, "recovery": {}}

    def label(now: float) -> str:
        return "measure" if now < cut else "fault" if now < back else "recovery"

    async def scrape_now(what: str) -> tuple[dict, dict | None]:
        found, error, disk = await observe(ctx)
        if error:
            events[f"{what}_metrics_error"] = error
        return found, disk

    async def switch() -> None:
        await asyncio.sleep(max(0.0, cut - time.monotonic()))
        events["cut_at"] = round(time.monotonic(), 6)
        at_cut, disk_cut = await scrape_now("cut")
        bounds["measure"]["after"] = bounds["fault"]["before"] = at_cut
        bounds["measure"]["disk_after"] = bounds["fault"]["disk_before"] = disk_cut
        ctx.say("FAULT cut" + (f": {a.cut_cmd}" if a.cut_cmd else ""))
        if a.cut_cmd:
            events["cut_exit"], said = await _shell(a.cut_cmd)
            if events["cut_exit"] != 0:
                events["cut_error"] = said
                ctx.say(f"FAULT cut failed (exit {events['cut_exit']}): {said}")
        await asyncio.sleep(max(0.0, back - time.monotonic()))
        events["restore_at"] = round(time.monotonic(), 6)
        ctx.say("FAULT restore" + (f": {a.restore_cmd}" if a.restore_cmd else ""))
        if a.restore_cmd:
            events["restore_exit"], said = await _shell(a.restore_cmd)
            if events["restore_exit"] != 0:
                events["restore_error"] = said
                ctx.say(f"FAULT restore failed (exit {events['restore_exit']}): {said}")
        # what HBM kept during the cut must not pass for hits that returned from FX; the load is still
        # running, so the reset preempts what is in flight
        try:
            events["eviction"] = await loop.run_in_executor(None, evict, ctx.endpoint, a.evict, a.restart_cmd,
                                                            a.health_timeout, ctx.simulated, True)
            if ctx.lmcache_api:  # and LMCache's DRAM, so recovered hits are the tier's, not what DRAM kept
                events["eviction"]["lmcache-dram"] = await loop.run_in_executor(None, clear_lmcache_dram,
                                                                                ctx.lmcache_api)
        except WorkloadError as error:
            events["eviction"] = {"error": str(error)}
            ctx.say(f"EVICT failed after the restore: {error}")
        at_recovery, disk_recovery = await scrape_now("recovery")
        events["recovery_metrics_at"] = round(time.monotonic(), 6)
        bounds["fault"]["after"] = bounds["recovery"]["before"] = at_recovery
        bounds["fault"]["disk_after"] = bounds["recovery"]["disk_before"] = disk_recovery

    take = _cycling_requests(ctx, sessions, a, conc, start + duration, lambda now: 1)
    switcher = asyncio.ensure_future(switch())
    cleared_first = ctx.dram_cleared

    def dram(key: tuple, st: PhaseStats) -> dict:
        """measure began after the run's eviction; fault at the cut (DRAM as it was); recovery after the
        post-restore eviction, cleared when that eviction emptied LMCache's DRAM."""
        if not ctx.lmcache_api:
            return {}
        return {"dram_cleared": {"measure": cleared_first, "fault": False,
                                 "recovery": "lmcache-dram" in (events.get("eviction") or {})}.get(key[0], False)}
    try:
        await run_requests(ctx, take, conc, labeller=label, extra={"fault": events}, phase_metrics=bounds,
                           per_label=dram)
    finally:
        if not switcher.done():
            switcher.cancel()
            if a.restore_cmd and "restore_at" not in events:
                await _shell(a.restore_cmd)


async def _shell(command: str) -> tuple[int, str]:
    """(exit code, the last lines it printed on stderr) of a shell command."""
    proc = await asyncio.create_subprocess_shell(command, stdout=asyncio.subprocess.DEVNULL,
                                                 stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    return proc.returncode, " | ".join(err.decode("utf-8", "replace").strip().splitlines()[-3:])[:500]


# ── Trace replay (G4) ──────────────────────────────────────────────────────────────────────────────

TRACE_COLUMNS = ("session_id", "turn", "prompt_tokens", "output_tokens", "arrival_offset_s")
TRACE_OPTIONAL = ("block_ids", "stratum")


def block_prompt(seed: int, blocks: tuple[str, ...], block_tokens: int, prompt_tokens: int, fill_key: str,
                 salt: str = "") -> list[int]:
    """A prompt built from content-addressed blocks: block id b is the same `block_tokens` tokens wherever it
    appears with the same salt (any session of one replay repetition), so shared and partial reuse are sent as the
    trace holds them, and other tokens under another salt (another repetition); the prompt is its first
    `prompt_tokens` tokens, and tokens beyond the listed blocks come from `fill_key` alone."""
    ids: list[int] = []
    address = f"{seed}:{salt}:block:" if salt else f"{seed}:block:"
    for block in blocks:
        if len(ids) >= prompt_tokens:
            break
        ids.extend(token_ids(address + block, block_tokens))
    if len(ids) < prompt_tokens:
        ids.extend(token_ids(fill_key, prompt_tokens - len(ids)))
    return ids[:prompt_tokens]


def gettext_noop(text: str) -> str:
    """Marks a message template for the translators (this file runs on the nodes: the standard library only)."""
    return text


class TraceError(WorkloadError):
    """A trace the client cannot replay: the file, the line and the column at fault, and why — a message
    `template` (English, marked for translation) with its `values`, so the portal says it in the reader's
    language without reading the English back (runners.traces.translate_trace_error)."""

    def __init__(self, path: str, template: str, line: int | None = None, column: str | None = None, **values):
        self.path, self.line, self.column, self.template = path, line, column, template
        self.values = {k: str(v) for k, v in values.items()}
        where = path + (f", line {line}" if line is not None else "") + (f", column {column}" if column else "")
        super().__init__(f"{where}: {template % self.values if values else template}", 2)


@dataclass
class TraceTurn:
    session_id: str
    turn: int
    prompt_tokens: int
    output_tokens: int
    arrival_offset_s: float
    line: int
    blocks: tuple[str, ...] | None = None   # content-addressed block ids (optional column block_ids)
    stratum: str = ""                       # first | shared_prefix | returning (optional column stratum)


def load_trace(path: str) -> list[TraceTurn]:
    """A customer session trace; every error names the file, the line and the column."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as error:
        raise TraceError(path, gettext_noop("cannot read the trace: %(error)s"), error=error) from None
    reader = csv.reader(text.splitlines())
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise TraceError(path, gettext_noop("the file is empty; expected the header %(header)s"),
                         header=",".join(TRACE_COLUMNS)) from None
    missing = [c for c in TRACE_COLUMNS if c not in header]
    if missing:
        raise TraceError(path, gettext_noop("missing column(s) %(missing)s; expected the header %(header)s"), 1,
                         missing=", ".join(missing), header=",".join(TRACE_COLUMNS))
    where = {c: header.index(c) for c in TRACE_COLUMNS + TRACE_OPTIONAL if c in header}
    turns: list[TraceTurn] = []
    seen: dict[tuple[str, int], int] = {}
    for line, row in enumerate(reader, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise TraceError(path, gettext_noop("%(fields)s fields where the header has %(header)s"), line,
                             fields=len(row), header=len(header))
        cells = {c: row[i].strip() for c, i in where.items()}
        if not cells["session_id"]:
            raise TraceError(path, gettext_noop("empty"), line, "session_id")
        turn, prompt, output = (_trace_int(path, line, cells, c, 1) for c in ("turn", "prompt_tokens", "output_tokens"))
        raw = cells["arrival_offset_s"]
        try:
            offset = float(raw)
        except ValueError:
            raise TraceError(path, gettext_noop("%(value)s is not a number"), line, "arrival_offset_s",
                             value=repr(raw)) from None
        if not math.isfinite(offset) or offset < 0:
            raise TraceError(path, gettext_noop("%(value)s must be a finite number ≥ 0"), line, "arrival_offset_s",
                             value=repr(raw))
        session = cells["session_id"]
        if (session, turn) in seen:
            raise TraceError(path, gettext_noop("session %(session)s turn %(turn)s already on line %(first)s"), line,
                             "turn", session=repr(session), turn=turn, first=seen[(session, turn)])
        seen[(session, turn)] = line
        blocks = tuple(cells["block_ids"].split()) if "block_ids" in cells else None
        turns.append(TraceTurn(session, turn, prompt, output, offset, line, blocks, cells.get("stratum", "")))
    if not turns:
        raise TraceError(path, gettext_noop("the trace has a header but no rows"))
    return turns


def _trace_int(path: str, line: int, cells: dict, column: str, low: int) -> int:
    value = cells[column]
    try:
        number = int(value)
    except ValueError:
        raise TraceError(path, gettext_noop("%(value)s is not a whole number"), line, column, value=repr(value)) from None
    if number < low:
        raise TraceError(path, gettext_noop("%(value)s is less than %(low)s"), line, column, value=number, low=low)
    return number


def replay_salt(a: argparse.Namespace, repetition: int) -> str:
    """The salt of one repetition's content address: within a repetition block b is the same tokens wherever it
    appears (the sharing across sessions the trace holds is kept), and in every other repetition, phase (replay,
    capacity) and run it is other tokens, so each repetition starts with nothing of it in any cache tier."""
    return f"{a.run_id}:{a.phase}:r{repetition}"


def replay_request(a: argparse.Namespace, t: TraceTurn, repetition: int, salt: str) -> PlannedRequest:
    """One trace turn as a request: blocks from the repetition's content address, the rest from the session's."""
    key = f"{a.seed}:{a.session_prefix or 'trace'}:{t.session_id}:{salt}"
    if t.blocks is not None:
        prompt = block_prompt(a.seed, t.blocks, a.block_tokens, t.prompt_tokens, f"{key}:{t.turn}:fill", salt)
    else:  # a session's turn n extends its turn n−1: token_ids of one key are prefixes of each other
        prompt = token_ids(key, t.prompt_tokens)
    return PlannedRequest(t.session_id, _ids_json(prompt), t.prompt_tokens, t.output_tokens, phase=a.phase,
                          repetition=repetition, concurrency=a.max_in_flight, turn=t.turn,
                          stratum=t.stratum or None)


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile by linear interpolation between order statistics (numpy's default); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(math.floor(position))
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def lateness_summary(values: list[float]) -> dict:
    """How late scheduled sends went out (s): p50, p99, max and how many."""
    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 6)
    return {"p50": r(quantile(values, 0.5)), "p99": r(quantile(values, 0.99)),
            "max": r(max(values) if values else None), "count": len(values)}


async def sleep_until(moment: float) -> None:
    """Sleep until the monotonic clock reaches `moment` (never wakes early: a send is never ahead of its time)."""
    while True:
        left = moment - time.monotonic()
        if left <= 0:
            return
        await asyncio.sleep(left)


async def cmd_replay(ctx: RunContext, a: argparse.Namespace, turns: list[TraceTurn]) -> None:
    """Open loop at the trace's arrival offsets (× --time-scale); a session's next turn never goes before its
    previous one has ended, and its prompt extends that turn's. Ordered (the default): one global queue in the
    trace's order (arrival offset, then line) sent strictly in that order — a request waiting for its session's
    previous answer holds back every later one, so none overtakes it. Unordered (--unordered): one sender per
    session, later requests of other sessions go ahead. Every repetition has its own salt in the content address
    (replay_salt), so it starts cold. Records carry send_seq, t_scheduled and send_lateness_s; their concurrency
    is the most requests this repetition had in flight, measured (the records of a repetition are held until it
    ends, in a journal beside the records file), concurrency_cap the cap (--max-in-flight, null: none)."""
    by_session: dict[str, list[TraceTurn]] = {}
    for t in turns:
        by_session.setdefault(t.session_id, []).append(t)
    chosen = list(by_session)[:a.max_sessions] if a.max_sessions else list(by_session)
    selected = [t for sid in chosen for t in by_session[sid]]
    cap = a.max_in_flight
    first = getattr(a, "first_repetition", 1) or 1
    ctx.recorder.total = len(selected) * a.repetitions
    for rep in range(first, first + a.repetitions):
        if rep > first:
            await _evict(ctx, a)
        salt = replay_salt(a, rep)
        ctx.say(f"PHASE {a.phase} repetition={rep} sessions={len(chosen)} requests={len(selected)} "
                f"order={'trace' if a.ordered else 'per-session'} salt={salt}")
        before, error_before, disk_before = await observe(ctx)
        stats: dict[tuple, PhaseStats] = {}
        ctx.sent = 0
        start = time.monotonic()
        cpu0 = _cpu()
        ctx.recorder.hold()
        try:
            if a.ordered:
                await _replay_ordered(ctx, a, selected, rep, salt, start, stats)
            else:
                gate = asyncio.Semaphore(cap) if cap else None
                await asyncio.gather(*(_replay_session(ctx, a, by_session[sid], rep, salt, start, gate, stats)
                                       for sid in chosen))
        finally:
            ctx.finalizer.drain()
            peak = max((st.max_in_flight for st in stats.values()), default=0)
            ctx.recorder.release(functools.partial(_measured_concurrency, peak=peak, cap=cap or None))
        cpu1 = _cpu()
        after, error_after, disk_after = await observe(ctx)
        lateness = [v for st in stats.values() for v in st.lateness]
        write_summaries(ctx, stats, tuple(y - x for x, y in zip(cpu0, cpu1)), before, after,
                        error_before or error_after,
                        {"trace_sessions": len(chosen), "salt": salt, "ordered": bool(a.ordered),
                         "concurrency": peak, "concurrency_cap": cap or None,
                         "lateness_s": lateness_summary(lateness)},
                        disk=(disk_before, disk_after))


def _measured_concurrency(record: dict, peak: int, cap: int | None) -> None:
    record["concurrency"], record["concurrency_cap"] = peak, cap


async def _replay_ordered(ctx: RunContext, a: argparse.Namespace, turns: list[TraceTurn], rep: int, salt: str,
                          start: float, stats: dict) -> None:
    """One global queue in the trace's order, each request sent at its time once its session's previous one has
    ended and a slot under the cap is free, and written to its connection before the next one is looked at."""
    queue = sorted(turns, key=lambda t: (t.arrival_offset_s, t.line))
    cap = a.max_in_flight
    idle: list[StreamClient] = []
    clients: list[StreamClient] = []
    last: dict[str, asyncio.Future] = {}
    running: set[asyncio.Future] = set()
    count = [0]
    freed = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def one(req: PlannedRequest, client: StreamClient, sent: asyncio.Future) -> None:
        try:
            await send_one(ctx, client, req, a.phase, stats_for(stats, a.phase, req), sent)
        finally:
            idle.append(client)
            count[0] -= 1
            freed.set()

    try:
        for t in queue:
            due = start + t.arrival_offset_s * a.time_scale
            await sleep_until(due)
            previous = last.get(t.session_id)
            if previous is not None and not previous.done():
                await asyncio.wait([previous])
            while cap and count[0] >= cap:
                freed.clear()
                await freed.wait()
            req = replay_request(a, t, rep, salt)
            req.t_scheduled = due
            if idle:
                client = idle.pop()
            else:
                client = StreamClient(ctx.endpoint, ctx.timeout, ctx.coalesce)
                clients.append(client)
            sent = loop.create_future()
            count[0] += 1
            task = asyncio.ensure_future(one(req, client, sent))
            running.add(task)
            task.add_done_callback(running.discard)
            last[t.session_id] = task
            await asyncio.wait([sent, task], return_when=asyncio.FIRST_COMPLETED)
        if running:
            await asyncio.gather(*running)
    finally:
        for task in list(running):
            task.cancel()
        for client in clients:
            client.close()


async def _replay_session(ctx: RunContext, a: argparse.Namespace, turns: list[TraceTurn], rep: int, salt: str,
                          start: float, gate: asyncio.Semaphore | None, stats: dict) -> None:
    clients: dict = {}
    try:
        for t in sorted(turns, key=lambda t: t.turn):
            due = start + t.arrival_offset_s * a.time_scale
            await sleep_until(due)
            req = replay_request(a, t, rep, salt)
            req.t_scheduled = due
            if gate is None:
                await send_one(ctx, client_for(ctx, clients, req), req, a.phase, stats_for(stats, a.phase, req))
            else:
                async with gate:
                    await send_one(ctx, client_for(ctx, clients, req), req, a.phase, stats_for(stats, a.phase, req))
    finally:
        for client in clients.values():
            client.close()


# ── Command line ───────────────────────────────────────────────────────────────────────────────────

COMMANDS = ("populate", "evict", "measure", "cold-recovery", "probe", "replay", "share", "soak", "fault")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every level must be ≥ 1")
    return values


def _methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    for m in methods:
        if m not in ("reset", "drop-caches", "restart", "none"):
            raise argparse.ArgumentTypeError(f"unknown eviction method {m!r} (reset, drop-caches, restart, none)")
    return methods


def _positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value >= 0 or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text!r} must be ≥ 0")
        return value
    return parse


def _device(text: str) -> str:
    name = text.strip()
    if name.startswith("/dev/"):
        name = name[5:]
    if not DEVICE_NAME.match(name):
        raise argparse.ArgumentTypeError(f"{text!r} is not a block device's kernel name (e.g. nvme1n1, loop7)")
    return name


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workload.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=COMMANDS)
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--out", required=True, help="records file (JSON lines, appended)")
    p.add_argument("--arm", required=True, help="recompute, local_nvme, fx, …")
    p.add_argument("--model", help="model name sent in requests (default: the server's first /v1/models entry)")
    p.add_argument("--run-id", default="run")
    p.add_argument("--instance", help="name of the server in records (default host:port)")
    p.add_argument("--simulated", choices=("auto", "yes", "no"), default="auto")
    p.add_argument("--timeout", type=_positive(float), default=3600.0, help="seconds per request")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--session-prefix", default="", help="session names start with this (default per command)")
    p.add_argument("--api-key-env", default="", help="name of an environment variable holding a bearer token")
    p.add_argument("--versions", default="", help='JSON object copied into summaries, e.g. {"vllm": "0.20.1"}')
    p.add_argument("--quiet", action="store_true", help="no PROGRESS/PHASE lines on stdout")
    p.add_argument("--prompt-tokens-details", choices=("on", "off"), default="on",
                   help="on (default; deploy.sh starts vLLM with --enable-prompt-tokens-details): a usage without "
                        "prompt_tokens_details means 0 cached tokens, as vLLM 0.20.1 leaves it out on a miss; off: "
                        "the server reports no cached tokens and records say null")
    p.add_argument("--coalesce-ms", type=_positive(float), default=DEFAULT_COALESCE_MS,
                   help="after a stream's first token, read it at most once per this many ms (sooner as its end "
                        "nears): fewer reads, less client CPU; kernel receive stamps keep t_end exact. 0: read "
                        "every byte as it arrives")
    g = p.add_argument_group("sessions and load")
    g.add_argument("--sessions", type=_positive(int), default=0,
                   help="sessions (default: max concurrency × requests per client)")
    g.add_argument("--prompt-tokens", type=_positive(int), default=COLD_RECOVERY["prompt_tokens"],
                   help="context length of a session")
    g.add_argument("--turn-tokens", type=_positive(int), default=COLD_RECOVERY["turn_tokens"],
                   help="new turn appended when a session returns")
    g.add_argument("--output-tokens", type=_positive(int), default=COLD_RECOVERY["output_tokens"])
    g.add_argument("-c", "--concurrency", type=_int_list, default=list(DEFAULT_CONCURRENCY),
                   help="closed-loop concurrency levels, e.g. 8,16,32 (modes with one level use the first)")
    g.add_argument("--populate-concurrency", type=_positive(int), default=0, help="default: the highest level")
    g.add_argument("--repetitions", type=_positive(int), default=COLD_RECOVERY["repetitions"])
    g.add_argument("--first-repetition", type=_positive(int), default=1,
                   help="number of the first repetition (an extension of a marginal run continues the count)")
    g.add_argument("--requests-per-client", type=_positive(int), default=COLD_RECOVERY["requests_per_client"])
    g = p.add_argument_group("eviction")
    g.add_argument("--evict", type=_methods, default=["reset", "drop-caches"],
                   help="comma list of reset, drop-caches, restart, none (default reset,drop-caches)")
    g.add_argument("--restart-cmd", help="shell command that restarts the server (for --evict restart)")
    g.add_argument("--health-timeout", type=_positive(float), default=600.0)
    g.add_argument("--lmcache-api", action="append", default=[], metavar="URL",
                   help="an LMCache internal API server (http://127.0.0.1:PORT), once per LMCache process that owns a "
                        "cache: every eviction, after the prefix-cache reset, empties its DRAM with DELETE "
                        "URL/cache/clear?locations=LocalCPUBackend (refused or non-2xx: the run stops, exit 3)")
    g = p.add_argument_group("tier attribution")
    g.add_argument("--disk-device", type=_device, metavar="NAME",
                   help="kernel name of the block device holding the disk tier (e.g. nvme1n1): its sectors read "
                        f"(${DISKSTATS_ENV}, else /proc/diskstats) are sampled with every /metrics scrape into the "
                        "summaries' tier_bytes")
    g = p.add_argument_group("probe")
    g.add_argument("--prompts", type=_positive(int), default=PROBE["prompts"])
    g.add_argument("--no-warm", action="store_true", help="probe without the warm pass and eviction")
    g = p.add_argument_group("replay")
    g.add_argument("--trace", help="customer trace CSV: " + ",".join(TRACE_COLUMNS))
    g.add_argument("--max-sessions", type=_positive(int), default=0)
    g.add_argument("--max-in-flight", type=_positive(int), default=0,
                   help="cap on requests in flight (replay 0: none; open-loop soak 0: "
                        f"max({SOAK_CAP_MIN}, {SOAK_CAP_PER_CLIENT} × -c))")
    g.add_argument("--time-scale", type=_positive(float), default=1.0, help="multiplies arrival offsets")
    g.add_argument("--block-tokens", type=_positive(int), default=512,
                   help="tokens per block id of the trace's block_ids column (default 512)")
    g.add_argument("--phase", choices=("replay", "capacity"), default="replay",
                   help="the records' phase: capacity for G4's replay against a capped tier (default replay)")
    g.add_argument("--ordered", dest="ordered", action="store_true", default=True,
                   help="(default) one global queue in the trace's order (arrival offset, line), sent strictly in "
                        "that order at the trace's times")
    g.add_argument("--unordered", dest="ordered", action="store_false",
                   help="one sender per session: a later request of another session may go before an earlier one "
                        "that waits for its session's previous answer")
    g = p.add_argument_group("share")
    g.add_argument("--url-b", help="instance B (reads what instance A wrote)")
    g.add_argument("--instance-b")
    g = p.add_argument_group("soak and fault")
    g.add_argument("--duration-s", type=_positive(float), default=0.0,
                   help="soak: required; fault: default fault start + 2 × fault seconds")
    g.add_argument("--windows", type=_positive(int), default=6)
    g.add_argument("--min-requests", type=_positive(int), default=0,
                   help="soak: error-free requests its failure-rate bar needs; past --duration-s the soak keeps "
                        "sending (into its last window) until it has them, for at most --duration-s more (0: none)")
    g.add_argument("--rate", type=_positive(float), default=0.0,
                   help="soak: open loop at this many requests per second (0: the closed loop of -c clients)")
    g.add_argument("--arrivals", choices=("poisson", "trace"), default="poisson",
                   help="soak --rate: Poisson arrivals from a seeded RNG (default), or --trace's own inter-arrival "
                        "gaps scaled to the rate")
    g.add_argument("--max-lateness-s", type=_positive(float), default=None,
                   help="soak --rate: the bound on the send lateness p99 above which the summaries say "
                        "schedule_kept: false (default one mean inter-arrival time, 1/rate, at most "
                        f"{SOAK_LATENESS_MAX_S:g} s)")
    g.add_argument("--dram-tokens", type=_positive(int), default=0,
                   help="soak: tokens of KV cache LMCache's DRAM holds on this instance (the deployment's DRAM size ÷ "
                        "KV bytes per token); the session pool is sized above HBM plus this, so returns come from "
                        "the disk tier (0: HBM alone)")
    g.add_argument("--closed-loop", action="store_true",
                   help="soak: the closed loop (-c clients, each sends when its last answer ended); the default "
                        "without --rate")
    g.add_argument("--fault-start", type=_positive(float), default=10.0, help="seconds of load before the cut")
    g.add_argument("--fault-seconds", type=_positive(float), default=60.0)
    g.add_argument("--cut-cmd", help="shell command that cuts the FX path")
    g.add_argument("--restore-cmd", help="shell command that restores it")
    return p


def plan_args(command: str, workloads: dict) -> list[str]:
    """CLI flags for `command` from a plan's `workloads` section (gates/plans/*.yaml), so the plan's
    numbers, not this module's defaults, drive a gate run."""
    section = {"cold-recovery": "cold_recovery", "populate": "cold_recovery", "measure": "cold_recovery",
               "probe": "probe_prompts", "replay": "replay", "soak": "soak", "fault": "fault",
               "share": "share"}.get(command)
    values = dict(workloads.get(section) or {}) if section else {}
    flags = {"prompt_tokens": "--prompt-tokens", "turn_tokens": "--turn-tokens", "output_tokens": "--output-tokens",
             "requests_per_client": "--requests-per-client", "repetitions": "--repetitions", "sessions": "--sessions",
             "prompts": "--prompts", "max_sessions": "--max-sessions", "windows": "--windows",
             "cut_seconds": "--fault-seconds", "fault_start_s": "--fault-start", "duration_s": "--duration-s",
             "max_lateness_s": "--max-lateness-s"}
    out: list[str] = []
    if "hours" in values:
        values.setdefault("duration_s", float(values["hours"]) * 3600)
    for key, flag in flags.items():
        if key in values:
            out += [flag, str(values[key])]
    if "concurrency" in values:
        levels = values["concurrency"]
        out += ["--concurrency", ",".join(str(v) for v in (levels if isinstance(levels, list) else [levels]))]
    return out


def _first_model(endpoint: Endpoint) -> str:
    try:
        status, body = _http(endpoint, "GET", "/v1/models")
        data = json.loads(body) if status == 200 else {}
        return str(data["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        raise WorkloadError(f"--model not given and {endpoint.name}/v1/models did not name one") from None


async def _until_terminated(run: Any) -> None:
    """SIGTERM (a cancel) stops the run but first records every request that had finished."""
    task = asyncio.current_task()
    terminated = []

    def stop() -> None:
        terminated.append(True)
        task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
    try:
        await run
    except asyncio.CancelledError:
        if not terminated:
            raise
        raise WorkloadError("terminated by SIGTERM; every request that had finished is recorded", 143) from None


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        api_key = os.environ.get(a.api_key_env) if a.api_key_env else None
        endpoint = Endpoint(a.url, api_key)
        versions = None
        if a.versions:
            try:
                versions = json.loads(a.versions)
            except ValueError:
                raise WorkloadError(f"--versions {a.versions!r} is not JSON", 2) from None
        soak_trace = a.command == "soak" and a.rate and a.arrivals == "trace"
        turns = load_trace(a.trace) if (a.command == "replay" or soak_trace) and a.trace else None
        if a.command == "replay" and turns is None:
            raise WorkloadError("replay needs --trace FILE.csv", 2)
        if a.command in ("soak",) and not a.duration_s:
            raise WorkloadError("soak needs --duration-s", 2)
        if a.command == "soak" and a.closed_loop and a.rate:
            raise WorkloadError(f"soak: --closed-loop and --rate {a.rate:g} contradict each other (the rate is the "
                                "open loop's)", 2)
        if soak_trace and turns is None:
            raise WorkloadError("soak --arrivals trace needs --trace FILE.csv", 2)
        a.trace_turns = turns
        for url in a.lmcache_api:
            lmcache_endpoint(url)
        model = a.model or ("" if a.command == "evict" else _first_model(endpoint))
        # simulated when told so or when the server says it is the simulator: no flag makes the simulator's answers real
        simulated = a.simulated == "yes" or detect_simulated(endpoint)
        recorder = Recorder(a.out, quiet=a.quiet)
        ctx = RunContext(endpoint, model, a.arm, a.run_id, a.instance or endpoint.name, recorder, simulated,
                         a.timeout, versions=versions, quiet=a.quiet, coalesce=a.coalesce_ms / 1000,
                         prompt_tokens_details=a.prompt_tokens_details == "on", lmcache_api=list(a.lmcache_api),
                         disk_device=a.disk_device)
        try:
            if a.command == "cold-recovery":
                run = cmd_cold_recovery(ctx, a)
            elif a.command == "populate":
                run = cmd_cold_recovery(ctx, a, measure=False)
            elif a.command == "measure":
                run = cmd_cold_recovery(ctx, a, populate=False)
            elif a.command == "evict":
                run = cmd_evict(ctx, a)
            elif a.command == "replay":
                run = cmd_replay(ctx, a, turns)
            else:
                run = {"probe": cmd_probe, "share": cmd_share, "soak": cmd_soak, "fault": cmd_fault}[a.command](ctx, a)
            asyncio.run(_until_terminated(run))
            recorder.progress()
            ctx.say("DONE")
        finally:
            recorder.close()
    except WorkloadError as error:
        print(f"workload.py {a.command}: error: {error}", file=sys.stderr, flush=True)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
