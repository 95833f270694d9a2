"""The trace formats customers and serving teams already have, read as they are.

| key | format | one request | sessions | reuse |
|---|---|---|---|---|
| `mooncake` | Mooncake / FAST'25 JSONL (also vLLM's timed trace and AIPerf's `mooncake_trace`) | `{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}` | `session_id` when present, else inferred (below) | `hash_ids`, 512-token blocks by default |
| `azure` | Azure LLM inference CSV (2023, 2024) | `TIMESTAMP,ContextTokens,GeneratedTokens`, the time with up to 9 fractional digits | none: each request is its own | unknown |
| `burstgpt` | BurstGPT CSV | `Timestamp,[Session ID,Elapsed time,]Model,Request tokens,Response tokens,Total tokens,Log Type` | `Session ID` when present, else each request its own | unknown |
| `fxpilot` | fxpilot's session CSV | `session_id,turn,prompt_tokens,output_tokens,arrival_offset_s[,block_ids]` | given | `block_ids` (space-separated ids of `block_tokens`-token blocks) when present, else each turn's prompt extends the previous turn's (the session prefix) |

Every file is read as a stream (JSON lines in chunks, CSV row by row) into compact columns: a request costs
about 40 bytes, a block reference 8. A bad file raises `TraceFormatError` naming the file, the format, the
line and the field; nothing is kept from it.

**Sessions inferred** (Mooncake without `session_id`): a request continues the session of the latest earlier
request that last held the end of its leading run of already-seen blocks, when that run is at least two
blocks long and covers every full block of that earlier request; otherwise it starts a session. A system
prompt of one block shared by every request therefore joins no sessions; requests that share a longer
prefix without extending each other's whole prompt stay apart.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import warnings
from array import array
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

FORMATS = {
    "mooncake": "Mooncake/FAST'25 JSONL",
    "azure": "Azure LLM inference CSV",
    "burstgpt": "BurstGPT CSV",
    "fxpilot": "fxpilot session CSV",
}
DEFAULT_BLOCK_TOKENS = 512   # the Mooncake traces' block size (FAST'25 README), also fxpilot's default
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
FXPILOT_COLUMNS = ("session_id", "turn", "prompt_tokens", "output_tokens", "arrival_offset_s")
CHUNK_BYTES = 8 << 20


def gettext_noop(text: str) -> str:
    """Marks a message template for the translators (makemessages finds it by this name); returns it as it is.
    This module stays below Django: the portal translates a TraceFormatError from its `template` and `values`."""
    return text


class TraceFormatError(ValueError):
    """A trace that cannot be read: the file, the format, the line and the field at fault, and why.

    Why is a message `template` (English, marked for translation) and its `values`; `reason` is the two put
    together in English. runners.traces says it in the reader's language from the same template and values."""

    def __init__(self, name: str, fmt: str | None, template: str, line: int | None = None, field: str | None = None,
                 **values):
        self.template, self.values = template, {k: str(v) for k, v in values.items()}
        message = template % self.values if values else template
        self.name, self.format, self.line, self.field, self.reason = name, fmt, line, field, message
        where = name
        if fmt:
            where += f" ({FORMATS.get(fmt, fmt)})"
        if line is not None:
            where += f", line {line}"
        if field:
            where += f", field {field}"
        super().__init__(f"{where}: {message}")


@dataclass
class Trace:
    """One trace as columns, in file order. Times are seconds from the trace's first request in file order."""

    format: str
    name: str
    timestamps: np.ndarray            # float64 seconds
    input_tokens: np.ndarray          # int64
    output_tokens: np.ndarray         # int64
    lines: np.ndarray                 # int64, the line each request was read from
    session: np.ndarray | None = None          # int64 session index per request (None: not known yet)
    session_names: list[str] | None = None
    session_basis: str = "each-request"        # given | inferred | each-request
    turn: np.ndarray | None = None             # int64 (fxpilot CSV)
    block_offsets: np.ndarray | None = None    # int64, R + 1: request i's blocks are ids[off[i]:off[i+1]]
    block_ids: np.ndarray | None = None        # int64
    block_tokens: int | None = None
    reuse_basis: str | None = None             # block-ids | session-prefix | None
    reuse_reason: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def format_name(self) -> str:
        return FORMATS[self.format]

    @property
    def requests(self) -> int:
        return int(self.input_tokens.size)

    @property
    def reuse_known(self) -> bool:
        return self.block_ids is not None

    def blocks(self, i: int) -> np.ndarray:
        return self.block_ids[self.block_offsets[i]:self.block_offsets[i + 1]]

    def arrival_order(self) -> np.ndarray:
        """Request indices in arrival order; equal timestamps keep file order."""
        return np.argsort(self.timestamps, kind="stable")


# ── detection ────────────────────────────────────────────────────────────────────────────────────

def _header_names(line: str) -> list[str]:
    try:
        return [h.strip() for h in next(csv.reader([line]))]
    except (StopIteration, csv.Error):
        return []


def detect_format(first_line: str) -> str | None:
    """The format whose first line this is (a JSON object, or a CSV header), None when none fits."""
    text = first_line.lstrip("\ufeff").strip()
    if text.startswith("{"):
        return "mooncake"
    names = set(_header_names(text))
    if set(AZURE_COLUMNS) <= names:
        return "azure"
    if set(BURSTGPT_COLUMNS) <= names:
        return "burstgpt"
    if set(FXPILOT_COLUMNS) <= names:
        return "fxpilot"
    return None


def _first_line(path: Path, name: str) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError as error:
        raise TraceFormatError(name, None, gettext_noop("cannot read the trace: %(error)s"),
                               error=error.strerror or error) from None
    for raw in head.splitlines():
        if raw.strip():
            return raw.decode("utf-8-sig", errors="replace")
    raise TraceFormatError(name, None, gettext_noop("the file is empty"))


WHOLE = gettext_noop("%(value)s is not a whole number")
NUMBER = gettext_noop("%(value)s is not a number")
EXPECTED = ("Mooncake/FAST'25 JSONL ({\"timestamp\", \"input_length\", \"output_length\", \"hash_ids\"}), "
            "Azure LLM inference CSV (TIMESTAMP,ContextTokens,GeneratedTokens), BurstGPT CSV (Timestamp,…,"
            "Request tokens,Response tokens,…) or fxpilot session CSV (session_id,turn,prompt_tokens,output_tokens,"
            "arrival_offset_s[,block_ids])")


_PROGRESS: ContextVar[Callable[[float], None] | None] = ContextVar("trace_progress", default=None)


def _report(done: int, total: int) -> None:
    """Tell the reader's caller how far it is (bytes read ÷ the file's size), when it asked (read_trace)."""
    hook = _PROGRESS.get()
    if hook is not None and total > 0:
        hook(min(1.0, done / total))


def read_trace(path: str | Path, fmt: str | None = None, *, block_tokens: int | None = None,
               name: str | None = None, progress: Callable[[float], None] | None = None) -> Trace:
    """Read a trace file, detecting its format unless `fmt` is given; raises TraceFormatError.

    `progress`, when given, is called now and then with the share of the file read (0–1)."""
    token = _PROGRESS.set(progress)
    try:
        return _read_trace(Path(path), fmt, block_tokens=block_tokens, name=name)
    finally:
        _PROGRESS.reset(token)


def _read_trace(path: Path, fmt: str | None, *, block_tokens: int | None, name: str | None) -> Trace:
    name = name or path.name
    if fmt is not None and fmt not in FORMATS:
        raise TraceFormatError(name, None, gettext_noop("unknown format %(format)s; the formats are %(formats)s"),
                               format=repr(fmt), formats=", ".join(FORMATS))
    if block_tokens is not None and block_tokens < 1:
        raise TraceFormatError(name, fmt, gettext_noop("block tokens %(value)s must be ≥ 1"), value=block_tokens)
    first = _first_line(path, name)
    detected = detect_format(first)
    if fmt is None:
        if detected is None:
            raise TraceFormatError(name, None, gettext_noop("not a trace format fxpilot reads; expected %(expected)s"),
                                   line=1, expected=EXPECTED)
        fmt = detected
    reader = {"mooncake": _read_mooncake, "azure": _read_azure, "burstgpt": _read_burstgpt,
              "fxpilot": _read_fxpilot}[fmt]
    try:
        trace = reader(path, name, block_tokens or DEFAULT_BLOCK_TOKENS)
    finally:
        release_memory()
    if trace.requests == 0:
        raise TraceFormatError(name, fmt, gettext_noop("the trace has no requests"))
    return trace


def bounded_heap() -> None:
    """Large buffers straight from and back to the system (glibc's mmap threshold fixed at 1 MB instead of
    growing with each freed array, which leaves a million-request analysis ~100 MB of heap it no longer uses).
    Process-wide: called by the command line and the background job that analyse traces, not by the library."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)    # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def release_memory() -> None:
    """Give the C heap's freed pages back to the system (glibc keeps ~200 MB of a million-line parse's
    short-lived buffers otherwise); nothing on other C libraries."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# ── shared checks ────────────────────────────────────────────────────────────────────────────────

def _whole(value, name, fmt, line, fld, low=0) -> int:
    if isinstance(value, bool):
        raise TraceFormatError(name, fmt, WHOLE, line, fld, value=repr(value))
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            try:
                as_float = float(value)
            except ValueError:
                as_float = math.nan
            if not (math.isfinite(as_float) and as_float.is_integer()):
                raise TraceFormatError(name, fmt, WHOLE, line, fld, value=repr(value)) from None
            number = int(as_float)
    else:
        raise TraceFormatError(name, fmt, WHOLE, line, fld, value=repr(value))
    if number < low:
        raise TraceFormatError(name, fmt, gettext_noop("%(value)s is less than %(low)s"), line, fld, value=number,
                               low=low)
    return number


def _seconds(value, name, fmt, line, fld) -> float:
    if isinstance(value, bool):
        raise TraceFormatError(name, fmt, NUMBER, line, fld, value=repr(value))
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise TraceFormatError(name, fmt, NUMBER, line, fld, value=repr(value)) from None
    if not math.isfinite(number) or number < 0:
        raise TraceFormatError(name, fmt, gettext_noop("%(value)s must be a finite number ≥ 0"), line, fld,
                               value=repr(value))
    return number


class _Columns:
    """Append-only compact columns (array module), turned into numpy arrays at the end."""

    def __init__(self):
        self.ts, self.inp, self.out, self.line = array("d"), array("q"), array("q"), array("q")

    def add(self, ts, inp, out, line):
        self.ts.append(ts)
        self.inp.append(inp)
        self.out.append(out)
        self.line.append(line)

    def arrays(self):
        return (np.frombuffer(self.ts, dtype=np.float64).copy(), np.frombuffer(self.inp, dtype=np.int64).copy(),
                np.frombuffer(self.out, dtype=np.int64).copy(), np.frombuffer(self.line, dtype=np.int64).copy())


def _open_text(path: Path, name: str, fmt: str):
    try:
        return io.TextIOWrapper(open(path, "rb"), newline="", encoding="utf-8-sig")
    except OSError as error:
        raise TraceFormatError(name, fmt, gettext_noop("cannot read the trace: %(error)s"),
                               error=error.strerror or error) from None


def _csv_rows(path: Path, name: str, fmt: str, required: tuple[str, ...]) -> Iterator[tuple[int, list[str], dict]]:
    """(line, row, column index) of each non-blank data row; the header is checked first."""
    with _open_text(path, name, fmt) as f:
        reader = csv.reader(f)
        try:
            try:
                header = [h.strip() for h in next(reader)]
            except StopIteration:
                raise TraceFormatError(name, fmt, gettext_noop("the file is empty")) from None
            missing = [c for c in required if c not in header]
            if missing:
                raise TraceFormatError(name, fmt, gettext_noop("missing column(s) %(missing)s; the header must name "
                                                    "%(header)s"), line=1, missing=", ".join(missing),
                                       header=",".join(required))
            where = {h: i for i, h in enumerate(header)}
            width = len(header)
            previous = reader.line_num
            size = os.fstat(f.buffer.fileno()).st_size
            for row in reader:
                line = previous + 1      # the row's first physical line
                previous = reader.line_num
                if not line & 0x3FFF:
                    _report(f.buffer.tell(), size)
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != width:
                    raise TraceFormatError(name, fmt, gettext_noop("%(fields)s fields where the header has %(header)s"),
                                           line, fields=len(row), header=width)
                yield line, row, where
        except UnicodeDecodeError as error:
            raise TraceFormatError(name, fmt, gettext_noop("not UTF-8 text (%(error)s at byte %(byte)s)"),
                                   error=error.reason, byte=error.start) from None
        except csv.Error as error:
            raise TraceFormatError(name, fmt, gettext_noop("not a well-formed CSV row: %(error)s"), reader.line_num,
                                   error=error) from None


# ── Mooncake / FAST'25 JSONL ─────────────────────────────────────────────────────────────────────

_MOONCAKE_FAST = re.compile(
    rb'^[ \t]*\{"timestamp": ?(\d+(?:\.\d+)?), ?"input_length": ?(\d+), ?"output_length": ?(\d+), '
    rb'?"hash_ids": ?\[([\d, ]*)\]\}[ \t]*\r?$', re.M)


def _read_mooncake(path: Path, name: str, block_tokens: int) -> Trace:
    fmt = "mooncake"
    cols = _Columns()
    counts = array("q")
    id_chunks: list[np.ndarray] = []
    sessions: list[str] | None = None
    line_no = 0
    try:
        f = open(path, "rb")
    except OSError as error:
        raise TraceFormatError(name, fmt, gettext_noop("cannot read the trace: %(error)s"),
                               error=error.strerror or error) from None
    with f:
        carry = b""
        size = os.fstat(f.fileno()).st_size
        while True:
            _report(f.tell(), size)
            chunk = f.read(CHUNK_BYTES)
            if not chunk and not carry:
                break
            data = carry + chunk
            if chunk:
                cut = data.rfind(b"\n")
                if cut < 0:
                    carry = data
                    continue
                data, carry = data[:cut + 1], data[cut + 1:]
            else:
                carry = b""
            if line_no == 0 and data.startswith(b"\xef\xbb\xbf"):
                data = data[3:]
            lines_here = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
            if sessions is None and _mooncake_fast(data, line_no, lines_here, cols, counts, id_chunks):
                line_no += lines_here
                continue
            sessions = _mooncake_slow(data, line_no, cols, counts, id_chunks, name, sessions)
            line_no += lines_here
    ts, inp, out, lines = cols.arrays()
    ts = ts / 1000.0
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.frombuffer(counts, dtype=np.int64), out=offsets[1:])
    ids = np.concatenate(id_chunks) if id_chunks else np.zeros(0, dtype=np.int64)
    del id_chunks
    trace = Trace(fmt, name, ts, inp, out, lines, block_offsets=offsets, block_ids=ids, block_tokens=block_tokens,
                  reuse_basis="block-ids")
    if sessions is not None:
        trace.session, trace.session_names = _dense(sessions)
        trace.session_basis = "given"
    return trace


def _mooncake_fast(data: bytes, base: int, lines_here: int, cols: _Columns, counts: array, id_chunks: list) -> bool:
    """Canonical lines in bulk; False (nothing kept) when any non-blank line is not of the canonical shape."""
    matches = _MOONCAKE_FAST.findall(data)
    if len(matches) != lines_here:   # a blank or non-canonical line: the slow path names lines exactly
        return False
    seg = [m[3] for m in matches]
    n = [s.count(b",") + 1 if s.strip() else 0 for s in seg]
    text = b",".join(s for s in seg if s.strip())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            ids = np.fromstring(text.decode(), sep=",", dtype=np.int64) if text else np.zeros(0, dtype=np.int64)
        except (ValueError, DeprecationWarning):
            return False
    if ids.size != sum(n) or (ids.size and ids.max() == np.iinfo(np.int64).max):  # beyond int64: slow path
        return False
    cols.ts.extend(map(float, (m[0] for m in matches)))
    cols.inp.extend(map(int, (m[1] for m in matches)))
    cols.out.extend(map(int, (m[2] for m in matches)))
    cols.line.extend(range(base + 1, base + 1 + len(matches)))
    counts.extend(n)
    id_chunks.append(_narrow(ids))
    return True


def _mooncake_slow(data: bytes, base: int, cols: _Columns, counts: array, id_chunks: list, name: str,
                   sessions: list[str] | None) -> list[str] | None:
    fmt = "mooncake"
    ids: list[int] = []
    for i, raw in enumerate(data.split(b"\n")):
        line = base + i + 1
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise TraceFormatError(name, fmt, gettext_noop("not a JSON object: %(error)s"), line,
                                   error=getattr(error, "msg", error)) from None
        if not isinstance(obj, dict):
            raise TraceFormatError(name, fmt, gettext_noop("not a JSON object"), line)
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in obj:
                raise TraceFormatError(name, fmt, gettext_noop("missing"), line, key)
        ts = _seconds(obj["timestamp"], name, fmt, line, "timestamp")
        inp = _whole(obj["input_length"], name, fmt, line, "input_length")
        out = _whole(obj["output_length"], name, fmt, line, "output_length")
        hashes = obj["hash_ids"]
        if not isinstance(hashes, list):
            raise TraceFormatError(name, fmt, gettext_noop("%(value)s is not a list of block ids"), line, "hash_ids",
                                   value=repr(hashes))
        for h in hashes:
            if isinstance(h, bool) or not isinstance(h, int):
                raise TraceFormatError(name, fmt, gettext_noop("%(value)s is not a whole-number block id"), line,
                                       "hash_ids", value=repr(h))
            if not -(1 << 63) <= h < (1 << 63):
                raise TraceFormatError(name, fmt, gettext_noop("%(value)s is out of range"), line, "hash_ids", value=h)
        if sessions is None and cols.line.buffer_info()[1] == 0 and "session_id" in obj:
            sessions = []
        if sessions is not None:
            sid = obj.get("session_id")
            if sid is None or isinstance(sid, (dict, list)) or str(sid).strip() == "":
                raise TraceFormatError(name, fmt, gettext_noop("missing (the first request names its session)"), line,
                                       "session_id")
            sessions.append(str(sid))
        cols.add(ts, inp, out, line)
        counts.append(len(hashes))
        ids.extend(hashes)
    id_chunks.append(_narrow(np.array(ids, dtype=np.int64)))
    return sessions


def _narrow(ids: np.ndarray) -> np.ndarray:
    """int32 when the ids fit (half the memory); a later chunk that does not fit widens the whole column."""
    if ids.size and (ids.min() < -(1 << 31) or ids.max() >= (1 << 31)):
        return ids
    return ids.astype(np.int32)


def _dense(names: list[str]) -> tuple[np.ndarray, list[str]]:
    index: dict[str, int] = {}
    dense = np.fromiter((index.setdefault(s, len(index)) for s in names), dtype=np.int64, count=len(names))
    return dense, list(index)


# ── Azure LLM inference CSV ──────────────────────────────────────────────────────────────────────

_AZURE_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
                         r"(?:(Z)|([+-])(\d{2}):?(\d{2}))?")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _AzureClock:
    """Wall-clock times with up to 9 fractional digits (the 2023 trace writes 7) as exact nanoseconds."""

    def __init__(self):
        self.seconds: dict[str, int] = {}

    def ns(self, text: str, name: str, line: int) -> int:
        m = _AZURE_TIME.fullmatch(text.strip())
        if m is None:
            raise TraceFormatError(name, "azure", gettext_noop("%(value)s is not a time like 2023-11-16 18:15:46.6805900"),
                                   line, "TIMESTAMP", value=repr(text))
        key = text[:m.end(6)] + (m[8] or "") + (m[9] or "") + (m[10] or "") + (m[11] or "")
        whole = self.seconds.get(key)
        if whole is None:
            try:
                moment = datetime(int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6]), tzinfo=UTC)
            except ValueError as error:
                raise TraceFormatError(name, "azure", gettext_noop("%(value)s is not a valid time: %(error)s"), line,
                                       "TIMESTAMP", value=repr(text), error=error) from None
            if m[9]:
                offset = timedelta(hours=int(m[10]), minutes=int(m[11]))
                moment = moment - offset if m[9] == "+" else moment + offset
            whole = (moment - _EPOCH) // timedelta(seconds=1)
            if len(self.seconds) > 100_000:
                self.seconds.clear()
            self.seconds[key] = whole
        fraction = m[7] or ""
        return whole * 1_000_000_000 + (int(fraction.ljust(9, "0")) if fraction else 0)


def _read_azure(path: Path, name: str, block_tokens: int) -> Trace:
    fmt = "azure"
    cols = _Columns()
    clock = _AzureClock()
    first: int | None = None
    for line, row, where in _csv_rows(path, name, fmt, AZURE_COLUMNS):
        ns = clock.ns(row[where["TIMESTAMP"]], name, line)
        if first is None:
            first = ns
        cols.add((ns - first) / 1e9, _whole(row[where["ContextTokens"]], name, fmt, line, "ContextTokens"),
                 _whole(row[where["GeneratedTokens"]], name, fmt, line, "GeneratedTokens"), line)
    ts, inp, out, lines = cols.arrays()
    if ts.size and ts.min() < 0:   # a row earlier than the first: times count from the earliest
        ts -= ts.min()
    return Trace(fmt, name, ts, inp, out, lines,
                 reuse_reason="the Azure LLM inference trace records only arrival times and token counts: no "
                              "sessions and no prompt content, so which prompts share a prefix is unknown")


# ── BurstGPT CSV ─────────────────────────────────────────────────────────────────────────────────

def _read_burstgpt(path: Path, name: str, block_tokens: int) -> Trace:
    fmt = "burstgpt"
    cols = _Columns()
    sessions: list[str] | None = None
    for line, row, where in _csv_rows(path, name, fmt, BURSTGPT_COLUMNS):
        if sessions is None and "Session ID" in where and not cols.line:
            sessions = []
        cols.add(_seconds(row[where["Timestamp"]], name, fmt, line, "Timestamp"),
                 _whole(row[where["Request tokens"]], name, fmt, line, "Request tokens"),
                 _whole(row[where["Response tokens"]], name, fmt, line, "Response tokens"), line)
        if sessions is not None:
            sid = row[where["Session ID"]].strip()
            if not sid:
                raise TraceFormatError(name, fmt, gettext_noop("empty"), line, "Session ID")
            sessions.append(sid)
    ts, inp, out, lines = cols.arrays()
    trace = Trace(fmt, name, ts, inp, out, lines,
                  reuse_reason="BurstGPT records token counts (and sessions in its newer files) but no prompt "
                               "content or block ids, so which prompts share a prefix is unknown")
    if sessions is not None:
        trace.session, trace.session_names = _dense(sessions)
        trace.session_basis = "given"
    return trace


# ── fxpilot session CSV ──────────────────────────────────────────────────────────────────────────

def _read_fxpilot(path: Path, name: str, block_tokens: int) -> Trace:
    fmt = "fxpilot"
    cols = _Columns()
    sessions: list[str] = []
    turns = array("q")
    counts = array("q")
    ids = array("q")
    block_index: dict[str, int] = {}
    seen: dict[tuple[str, int], int] = {}
    has_blocks: bool | None = None
    for line, row, where in _csv_rows(path, name, fmt, FXPILOT_COLUMNS):
        if has_blocks is None:
            has_blocks = "block_ids" in where
        session = row[where["session_id"]].strip()
        if not session:
            raise TraceFormatError(name, fmt, gettext_noop("empty"), line, "session_id")
        turn = _whole(row[where["turn"]], name, fmt, line, "turn", 1)
        prompt = _whole(row[where["prompt_tokens"]], name, fmt, line, "prompt_tokens", 1)
        output = _whole(row[where["output_tokens"]], name, fmt, line, "output_tokens", 1)
        offset = _seconds(row[where["arrival_offset_s"]], name, fmt, line, "arrival_offset_s")
        if (session, turn) in seen:
            raise TraceFormatError(name, fmt, gettext_noop("session %(session)s turn %(turn)s already on line %(first)s"),
                                   line, "turn", session=repr(session), turn=turn, first=seen[(session, turn)])
        seen[(session, turn)] = line
        if has_blocks:
            tokens = row[where["block_ids"]].split()
            if len(tokens) > -(-prompt // block_tokens):
                raise TraceFormatError(name, fmt, gettext_noop("%(ids)s block ids for %(prompt)s prompt tokens: at most "
                                                    "%(most)s blocks of %(block)s tokens"), line, "block_ids",
                                       ids=len(tokens), prompt=prompt, most=-(-prompt // block_tokens),
                                       block=block_tokens)
            counts.append(len(tokens))
            ids.extend(block_index.setdefault(t, len(block_index)) for t in tokens)
        cols.add(offset, prompt, output, line)
        sessions.append(session)
        turns.append(turn)
    ts, inp, out, lines = cols.arrays()
    trace = Trace(fmt, name, ts, inp, out, lines, turn=np.frombuffer(turns, dtype=np.int64).copy(),
                  block_tokens=block_tokens, session_basis="given")
    trace.session, trace.session_names = _dense(sessions)
    if has_blocks:
        trace.block_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(counts, dtype=np.int64), out=trace.block_offsets[1:])
        trace.block_ids = np.frombuffer(ids, dtype=np.int64).copy()
        trace.reuse_basis = "block-ids"
    else:
        trace.block_offsets, trace.block_ids = session_prefix_blocks(trace.session, trace.turn, inp, block_tokens)
        trace.reuse_basis = "session-prefix"
    return trace


def session_prefix_blocks(session: np.ndarray, turn: np.ndarray, prompt: np.ndarray,
                          block_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The block ids fxpilot's replay implies without a block_ids column: a session is one token stream and
    each turn's prompt is its first prompt_tokens tokens, so turn n shares every full block of turn n−1; the
    last, partial block of a prompt is its own (a partial block is never shared)."""
    full = prompt // block_tokens
    partial = (prompt % block_tokens) > 0
    counts = full + partial
    offsets = np.zeros(prompt.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    req = np.repeat(np.arange(prompt.size, dtype=np.int64), counts)
    pos = np.arange(total, dtype=np.int64) - offsets[req]
    ids = (session[req] << 24) | pos
    tail = partial[req] & (pos == full[req])
    ids[tail] = (np.int64(1) << 62) | req[tail]
    return offsets, ids


def read_bytes(data: bytes, name: str, fmt: str | None = None, block_tokens: int | None = None) -> Trace:
    """A trace held in memory (tests, small uploads), through a temporary file so that it streams the same way."""
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=Path(name).suffix or ".trace") as handle:
        handle.write(data)
        handle.flush()
        return read_trace(handle.name, fmt, block_tokens=block_tokens, name=name)


__all__ = ["FORMATS", "DEFAULT_BLOCK_TOKENS", "Trace", "TraceFormatError", "detect_format", "read_trace",
           "read_bytes", "session_prefix_blocks"]
