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
    "weka": "WEKA kv-cache-tester JSON",
    "bailian": "Alibaba Bailian usage-trace JSONL",
    "azure": "Azure LLM inference CSV",
    "burstgpt": "BurstGPT CSV",
    "fxpilot": "fxpilot session CSV",
}
PUBLIC_FORMATS = ("mooncake", "weka", "bailian", "azure", "burstgpt")   # read by this module alone
DEFAULT_BLOCK_TOKENS = 512   # the Mooncake traces' block size (FAST'25 README), also fxpilot's default
BAILIAN_BLOCK_TOKENS = 16    # the Bailian usage traces' block size (their README; AIPerf's bailian_trace)
BLOCK_CANDIDATES = (16, 32, 64, 128, 256, 512, 1024, 2048)   # block sizes a trace's ids are checked against
BLOCK_FIT = 0.9              # the share of requests whose ids must fit ⌈input ÷ block⌉ for that block size
GZIP_MAGIC = b"\x1f\x8b"
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
    warnings: list[dict] = field(default_factory=list)   # {template, values, line, field, message}: read, not refused
    block_tokens_basis: str | None = None      # given | format | inferred | default

    def warn(self, template: str, at_line: int | None = None, at_field: str | None = None, **values) -> None:
        """A doubt about the file that does not stop it being read, named like a refusal (file, line, field)."""
        text = {k: str(v) for k, v in values.items()}
        self.warnings.append({"template": template, "values": text, "line": at_line, "field": at_field,
                              "message": template % text if text else template})

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


_JSON_KEY = re.compile(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:')


def json_keys(head: str) -> set[str]:
    """The object keys named in the beginning of a JSON file (any depth: enough to tell the formats apart)."""
    return set(_JSON_KEY.findall(head[:1 << 16]))


def detect_format(first_line: str, head: str | None = None) -> str | None:
    """The format whose first line (or, for JSON, whose beginning `head`) this is; None when none fits."""
    text = first_line.lstrip("\ufeff").strip()
    if text.startswith(("{", "[")):
        keys = json_keys(head if head is not None else text)
        if "hash_id_scope" in keys or ("requests" in keys and ("block_size" in keys or {"t", "in"} <= keys)):
            return "weka"           # (a pretty-printed conversation may name block_size after a long requests[])
        if "chat_id" in keys or "parent_chat_id" in keys:
            return "bailian"
        if "timestamp" in keys or "delay" in keys or ("session_id" in keys and (
                "input_length" in keys or "text_input" in keys)):
            return "mooncake"
        return None
    names = set(_header_names(text))
    if set(AZURE_COLUMNS) <= names:
        return "azure"
    if set(BURSTGPT_COLUMNS) <= names:
        return "burstgpt"
    if set(FXPILOT_COLUMNS) <= names:
        return "fxpilot"
    return None


def looks_like(first_line: str, head: str | None = None) -> str | None:
    """What a file fxpilot does not read looks like, for the refusal (never a format's name it is not)."""
    text = first_line.lstrip("\ufeff").strip()
    if text.startswith(("{", "[")):
        keys = json_keys(head if head is not None else text)
        if "request_id" in keys and "timestamp" not in keys:
            return ("a ServeGen offline (batch) trace (request_id, input_length, hash_ids or duration): it has no "
                    "arrival times, so it cannot be replayed as traffic")
        if "requests" in keys and ("t" in keys or "in" in keys):
            return "a WEKA kv-cache-tester conversation without its block_size or hash_id_scope"
        if "messages" in keys or "payload" in keys:
            return "an AIPerf trace of recorded messages: no token counts or block ids to replay"
        if "hash_ids" in keys or "input_length" in keys:
            return "a Mooncake-like JSON trace without timestamp (or session_id + delay)"
        return "JSON of no trace format fxpilot knows"
    names = set(_header_names(text))
    if "TIMESTAMP" in names or "ContextTokens" in names:
        return "an Azure LLM inference CSV with a column missing"
    if "Request tokens" in names or "Response tokens" in names:
        return "a BurstGPT CSV with a column missing"
    if "session_id" in names or "prompt_tokens" in names:
        return "an fxpilot session CSV with a column missing"
    return None


def _head(path: Path, name: str) -> tuple[str, str]:
    """(first non-blank line, the first 64 KiB as text) of a trace file."""
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 16)
    except OSError as error:
        raise TraceFormatError(name, None, gettext_noop("cannot read the trace: %(error)s"),
                               error=error.strerror or error) from None
    text = raw.decode("utf-8-sig", errors="replace")
    for line in raw.splitlines():
        if line.strip():
            return line.decode("utf-8-sig", errors="replace"), text
    raise TraceFormatError(name, None, gettext_noop("the file is empty"))


def _first_line(path: Path, name: str) -> str:
    return _head(path, name)[0]


WHOLE = gettext_noop("%(value)s is not a whole number")
NUMBER = gettext_noop("%(value)s is not a number")
EXPECTED = ("Mooncake/FAST'25 JSONL ({\"timestamp\", \"input_length\", \"output_length\", \"hash_ids\"}, or AIPerf's "
            "session_id + delay), WEKA kv-cache-tester JSON, Bailian JSONL (chat_id, parent_chat_id), "
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
    with plain_file(path, name) as plain:
        first, head = _head(plain, name)
        detected = detect_format(first, head)
        if fmt is None:
            if detected is None:
                seems = looks_like(first, head)
                if seems:
                    raise TraceFormatError(name, None, gettext_noop("not a trace format fxpilot reads: it looks like "
                                                                    "%(seems)s; expected %(expected)s"),
                                           line=1, seems=seems, expected=EXPECTED)
                raise TraceFormatError(name, None, gettext_noop("not a trace format fxpilot reads; expected %(expected)s"),
                                       line=1, expected=EXPECTED)
            fmt = detected
        reader = {"mooncake": _read_mooncake, "weka": _read_weka, "bailian": _read_bailian, "azure": _read_azure,
                  "burstgpt": _read_burstgpt, "fxpilot": _read_fxpilot}[fmt]
        try:
            trace = reader(plain, name, block_tokens)
        finally:
            release_memory()
    if trace.requests == 0:
        raise TraceFormatError(name, fmt, gettext_noop("the trace has no requests"))
    _after_reading(trace, given_block_tokens=block_tokens)
    return trace


class plain_file:
    """The trace's path, or (gzip, told by its magic bytes whatever its name) a temporary file it is streamed out
    to; the temporary file is removed on exit."""

    def __init__(self, path: Path, name: str):
        self.path, self.name, self.temp = path, name, None

    def __enter__(self) -> Path:
        try:
            with open(self.path, "rb") as f:
                magic = f.read(2)
        except OSError as error:
            raise TraceFormatError(self.name, None, gettext_noop("cannot read the trace: %(error)s"),
                                   error=error.strerror or error) from None
        if magic != GZIP_MAGIC:
            return self.path
        import gzip
        import shutil
        import tempfile
        handle = tempfile.NamedTemporaryFile(prefix="trace-", suffix=".plain", delete=False)
        self.temp = Path(handle.name)
        try:
            with handle, gzip.open(self.path, "rb") as source:
                shutil.copyfileobj(source, handle, CHUNK_BYTES)
        except (OSError, EOFError, gzip.BadGzipFile) as error:
            self.temp.unlink(missing_ok=True)
            raise TraceFormatError(self.name, None, gettext_noop("a gzip file that cannot be decompressed: %(error)s"),
                                   error=error) from None
        return self.temp

    def __exit__(self, *exc) -> None:
        if self.temp is not None:
            self.temp.unlink(missing_ok=True)


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


class _MoonExtra:
    """What the careful path finds beyond the canonical four fields, one entry per request (file order)."""

    def __init__(self):
        self.session: list[str | None] = []
        self.delay = array("d")          # ms; NaN when absent
        self.has_ts = array("b")
        self.has_ids = array("b")
        self.text_tokens = array("q")    # −1: no text_input
        self.has_input = array("b")

    def pad(self, n: int) -> None:
        """Canonical requests read by the bulk path before the first careful one."""
        while len(self.session) < n:
            self.session.append(None)
            self.delay.append(math.nan)
            self.has_ts.append(1)
            self.has_ids.append(1)
            self.text_tokens.append(-1)
            self.has_input.append(1)


def _read_mooncake(path: Path, name: str, block_tokens: int | None) -> Trace:
    fmt = "mooncake"
    cols = _Columns()
    counts = array("q")
    id_chunks: list[np.ndarray] = []
    extra: _MoonExtra | None = None
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
            if _mooncake_fast(data, line_no, lines_here, cols, counts, id_chunks):
                line_no += lines_here
                continue
            if extra is None:
                extra = _MoonExtra()
            extra.pad(len(cols.line))
            _mooncake_slow(data, line_no, cols, counts, id_chunks, name, extra)
            line_no += lines_here
    ts, inp, out, lines = cols.arrays()
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.frombuffer(counts, dtype=np.int64), out=offsets[1:])
    ids = np.concatenate(id_chunks) if id_chunks else np.zeros(0, dtype=np.int64)
    del id_chunks
    if extra is not None:
        extra.pad(len(cols.line))
    trace = Trace(fmt, name, ts, inp, out, lines, block_offsets=offsets, block_ids=ids,
                  block_tokens=block_tokens or DEFAULT_BLOCK_TOKENS, reuse_basis="block-ids",
                  block_tokens_basis="given" if block_tokens else "default")
    _timestamp_unit(trace, "ms", np.frombuffer(extra.has_ts, dtype=np.int8).astype(bool) if extra else None)
    if extra is not None:
        _mooncake_sessions(trace, extra)
    trace.timestamps = trace.timestamps / 1000.0
    return trace


def _mooncake_sessions(trace: Trace, extra: _MoonExtra) -> None:
    """session_id (all or none), delay and text_input lines (AIPerf's multi-turn mooncake_trace), hash_ids (all or
    none): the columns the careful path read, checked and turned into sessions, arrivals and reuse."""
    name, fmt, R = trace.name, "mooncake", trace.requests
    lines = trace.lines
    named = np.array([s is not None for s in extra.session], dtype=bool)
    has_ts = np.frombuffer(extra.has_ts, dtype=np.int8).astype(bool)
    has_ids = np.frombuffer(extra.has_ids, dtype=np.int8).astype(bool)
    has_input = np.frombuffer(extra.has_input, dtype=np.int8).astype(bool)
    text = np.frombuffer(extra.text_tokens, dtype=np.int64)
    delay = np.frombuffer(extra.delay, dtype=np.float64)
    if named.any() and not named.all():
        at = int(np.flatnonzero(~named)[0])
        raise TraceFormatError(name, fmt, gettext_noop("missing here, though %(named)s of the %(total)s requests name "
                                                       "their session: every request names its session or none does"),
                               int(lines[at]), "session_id", named=int(named.sum()), total=R)
    if has_ids.any() and not has_ids.all():
        at = int(np.flatnonzero(~has_ids)[0])
        raise TraceFormatError(name, fmt, gettext_noop("missing here, though %(with)s of the %(total)s requests carry "
                                                       "block ids: every request carries them or none does"),
                               int(lines[at]), "hash_ids", **{"with": int(has_ids.sum()), "total": R})
    if not named.any():
        if not has_ts.all():
            at = int(np.flatnonzero(~has_ts)[0])
            raise TraceFormatError(name, fmt, gettext_noop("missing (a request without session_id needs its time)"),
                                   int(lines[at]), "timestamp")
        if not has_ids.any():
            trace.block_offsets = trace.block_ids = None
            trace.reuse_basis = None
            trace.reuse_reason = ("the requests carry no hash_ids and no session_id: which prompts share a prefix is "
                                  "unknown")
        return
    trace.session, trace.session_names = _dense([str(s) for s in extra.session])
    trace.session_basis = "given"
    # arrivals: a timestamp where given; else the session's previous arrival + delay (ms; AIPerf waits the delay
    # after the previous turn's answer, so this is the earliest the turn can come: the answer's time is not known)
    ts = trace.timestamps
    last: dict[int, float] = {}
    unanchored = 0
    session = trace.session
    if not has_ts.all():
        ts = ts.copy()
        for i in range(R):
            s = int(session[i])
            if has_ts[i]:
                last[s] = ts[i]
                continue
            d = 0.0 if math.isnan(delay[i]) else float(delay[i])
            if s not in last:
                unanchored += 1
                last[s] = d
            else:
                last[s] = last[s] + d
            ts[i] = last[s]
        trace.timestamps = ts
        if unanchored:
            trace.warn(gettext_noop("%(count)s session(s) begin without a timestamp: they start at 0 ms plus their "
                                    "delay, all together"), None, "timestamp", count=unanchored)
        trace.warn(gettext_noop("%(count)s request(s) timed by delay (ms after the session's previous request; the "
                                "previous answer's duration is not in the file, so they may come later)"), None,
                   "delay", count=int((~has_ts).sum()))
    # prompt lengths from text_input (no tokenizer: 4 bytes a token, estimated, said) and reuse by session prefix
    estimated = (~has_input) & (text >= 0)
    if (~has_input & (text < 0)).any():
        at = int(np.flatnonzero(~has_input & (text < 0))[0])
        raise TraceFormatError(name, fmt, gettext_noop("missing (and no text_input to count)"), int(lines[at]),
                               "input_length")
    if estimated.any():
        inp = trace.input_tokens.copy()
        context: dict[int, int] = {}
        order = np.argsort(ts, kind="stable")
        for i in order.tolist():
            s = int(session[i])
            if estimated[i]:
                inp[i] = context.get(s, 0) + int(text[i])
            context[s] = int(inp[i]) + int(trace.output_tokens[i])
        trace.input_tokens = inp
        trace.warn(gettext_noop("%(count)s prompt length(s) estimated from text_input at 4 bytes a token (no "
                                "tokenizer), each turn after the session's earlier turns and answers as AIPerf sends "
                                "them"), None, "text_input", count=int(estimated.sum()))
    if not has_ids.any():
        trace.turn = _turns(session, ts)
        bt = trace.block_tokens
        trace.block_offsets, trace.block_ids = session_prefix_blocks(session, trace.turn, trace.input_tokens, bt)
        trace.reuse_basis = "session-prefix"


def _turns(session: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Turn numbers by arrival within each session (1, 2, …)."""
    order = np.argsort(ts, kind="stable")
    turn = np.zeros(session.size, dtype=np.int64)
    counter: dict[int, int] = {}
    for i in order.tolist():
        s = int(session[i])
        counter[s] = counter.get(s, 0) + 1
        turn[i] = counter[s]
    return turn


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


def _block_list(hashes, name, fmt, line, fld="hash_ids") -> list:
    if not isinstance(hashes, list):
        raise TraceFormatError(name, fmt, gettext_noop("%(value)s is not a list of block ids"), line, fld,
                               value=repr(hashes))
    for h in hashes:
        if isinstance(h, bool) or not isinstance(h, int):
            raise TraceFormatError(name, fmt, gettext_noop("%(value)s is not a whole-number block id"), line, fld,
                                   value=repr(h))
        if not -(1 << 63) <= h < (1 << 63):
            raise TraceFormatError(name, fmt, gettext_noop("%(value)s is out of range"), line, fld, value=h)
    return hashes


def _mooncake_slow(data: bytes, base: int, cols: _Columns, counts: array, id_chunks: list, name: str,
                   extra: _MoonExtra) -> None:
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
        sid = obj.get("session_id")
        if sid is not None and (isinstance(sid, (dict, list, bool)) or str(sid).strip() == ""):
            raise TraceFormatError(name, fmt, gettext_noop("%(value)s is not a session name"), line, "session_id",
                                   value=repr(sid))
        has_ts = "timestamp" in obj and obj["timestamp"] is not None
        if not has_ts and sid is None:
            raise TraceFormatError(name, fmt, gettext_noop("missing"), line, "timestamp")
        ts = _seconds(obj["timestamp"], name, fmt, line, "timestamp") if has_ts else 0.0
        delay = _seconds(obj["delay"], name, fmt, line, "delay") if obj.get("delay") is not None else math.nan
        text = obj.get("text_input")
        if text is not None and not isinstance(text, str):
            raise TraceFormatError(name, fmt, gettext_noop("%(value)s is not text"), line, "text_input",
                                   value=repr(text)[:40])
        has_input = obj.get("input_length") is not None
        if not has_input and text is None:
            raise TraceFormatError(name, fmt, gettext_noop("missing"), line, "input_length")
        inp = _whole(obj["input_length"], name, fmt, line, "input_length") if has_input else 0
        if "output_length" not in obj:
            raise TraceFormatError(name, fmt, gettext_noop("missing"), line, "output_length")
        out = _whole(obj["output_length"], name, fmt, line, "output_length")
        hashes = obj.get("hash_ids")
        has_ids = hashes is not None
        hashes = _block_list(hashes, name, fmt, line) if has_ids else []
        cols.add(ts, inp, out, line)
        counts.append(len(hashes))
        ids.extend(hashes)
        extra.session.append(None if sid is None else str(sid))
        extra.delay.append(delay)
        extra.has_ts.append(1 if has_ts else 0)
        extra.has_ids.append(1 if has_ids else 0)
        extra.text_tokens.append(-1 if text is None else -(-len(text.encode()) // 4))
        extra.has_input.append(1 if has_input else 0)
    id_chunks.append(_narrow(np.array(ids, dtype=np.int64)))


def _narrow(ids: np.ndarray) -> np.ndarray:
    """int32 when the ids fit (half the memory); a later chunk that does not fit widens the whole column."""
    if ids.size and (ids.min() < -(1 << 31) or ids.max() >= (1 << 31)):
        return ids
    return ids.astype(np.int32)


def _dense(names: list[str]) -> tuple[np.ndarray, list[str]]:
    index: dict[str, int] = {}
    dense = np.fromiter((index.setdefault(s, len(index)) for s in names), dtype=np.int64, count=len(names))
    return dense, list(index)


def _timestamp_unit(trace: Trace, unit: str, present: np.ndarray | None = None) -> None:
    """Refuse times that are plainly in the other unit (before they are converted): seconds in a format whose unit
    is milliseconds (Mooncake) read as milliseconds would compress the trace 1,000-fold; milliseconds in a format of
    seconds (Bailian) would stretch it. Read on the file's own values (arrival gaps and fractional digits)."""
    ts = trace.timestamps if present is None else trace.timestamps[present]
    if ts.size < 8:
        return
    values = np.unique(ts)
    gaps = np.diff(values)
    if gaps.size == 0:
        return
    median_gap = float(np.median(gaps))
    fractional = float(np.mean(values != np.floor(values)))
    span = float(values[-1] - values[0])
    line = int(trace.lines[0])
    if unit == "ms" and fractional > 0.5 and median_gap < 1.0:
        raise TraceFormatError(trace.name, trace.format, gettext_noop(
            "the times look like seconds, not the format's milliseconds: %(fraction)s of them have a fraction and the "
            "median gap between arrivals is %(gap)s; read as milliseconds, %(requests)s requests would arrive within "
            "%(span)s s. Write them in milliseconds (× 1,000)"), line, "timestamp",
            fraction=f"{100 * fractional:.0f} %", gap=f"{median_gap:.3g}", requests=trace.requests,
            span=f"{span / 1000:.3g}")
    if unit == "s" and fractional == 0.0 and median_gap >= 100 and span > 10 * 86400:
        raise TraceFormatError(trace.name, trace.format, gettext_noop(
            "the times look like milliseconds, not the format's seconds: every one is whole, the median gap between "
            "arrivals is %(gap)s and read as seconds the trace would last %(days)s days. Write them in seconds"),
            line, "timestamp", gap=f"{median_gap:.3g}", days=f"{span / 86400:.0f}")


def _after_reading(trace: Trace, *, given_block_tokens: int | None) -> None:
    """Cross-checks on what was read: arrivals out of file order (a warning with the count and the largest jump
    back), and block ids against ⌈input ÷ block⌉ (the block size inferred when the format has none, else refused)."""
    if trace.reuse_basis == "session-prefix" and trace.session is not None and (
            np.bincount(trace.session).max() <= 1):
        # no block ids and every session one request: nothing says what they share — unknown, not "little"
        trace.block_offsets = trace.block_ids = None
        trace.reuse_basis = None
        trace.reuse_reason = ("no block ids, and every session is one request: which prompts share a prefix is "
                              "unknown (a block_ids column, or the sessions' later turns, would tell)")
    if trace.format != "weka":          # WEKA's conversations each start at 0: checked per conversation
        _out_of_order(trace, trace.timestamps, trace.lines)
    if trace.reuse_basis == "block-ids" and trace.format in ("mooncake", "weka", "bailian"):
        _check_block_size(trace)


def _out_of_order(trace: Trace, ts: np.ndarray, lines: np.ndarray, what: str = "") -> None:
    if ts.size < 2:
        return
    back = np.maximum.accumulate(ts) - ts
    late = int((back > 0).sum())
    if late:
        worst = int(np.argmax(back))
        trace.warn(gettext_noop("%(count)s request(s)%(what)s arrive earlier than a request above them in the file; the "
                                "largest jump back is %(jump)s s (line %(line)s): they are counted in arrival order"),
                   int(lines[worst]), "timestamp", count=late, what=what, jump=f"{float(back[worst]):.6g}",
                   line=int(lines[worst]))


def _fits(counts: np.ndarray, inp: np.ndarray, block: int) -> np.ndarray:
    """Whether each request's block ids cover its prompt in `block`-token blocks (⌈input ÷ block⌉ ids, or only the
    full blocks ⌊input ÷ block⌋ where a trace leaves the partial last block unhashed)."""
    return (counts == -(-inp // block)) | (counts == inp // block)


def _check_block_size(trace: Trace) -> None:
    counts = np.diff(trace.block_offsets)
    inp = trace.input_tokens
    some = inp > 0
    if not some.any():
        return
    counts, inp, lines = counts[some], inp[some], trace.lines[some]
    bt = int(trace.block_tokens)
    fit = _fits(counts, inp, bt)
    share = float(fit.mean())
    if share >= BLOCK_FIT:
        if share < 1.0:
            at = int(np.flatnonzero(~fit)[0])
            trace.warn(gettext_noop("%(count)s request(s) have block ids that do not cover their prompt in "
                                    "%(block)s-token blocks (the first: %(ids)s ids for %(tokens)s tokens)"),
                       int(lines[at]), "hash_ids", count=int((~fit).sum()), block=bt, ids=int(counts[at]),
                       tokens=int(inp[at]))
        return
    shares = {c: float(_fits(counts, inp, c).mean()) for c in BLOCK_CANDIDATES}
    best = max(shares, key=lambda c: (shares[c], c))
    field_name = "hash_ids" if trace.format != "weka" else "requests[].hash_ids"
    if trace.block_tokens_basis == "default" and shares[best] >= BLOCK_FIT:
        trace.block_tokens = best
        trace.block_tokens_basis = "inferred"
        trace.warn(gettext_noop("block size inferred: %(best)s tokens (%(share)s of the requests have ⌈input ÷ "
                                "%(best)s⌉ block ids; only %(default_share)s fit the format's default %(default)s)"),
                   None, field_name, best=best, share=f"{100 * shares[best]:.1f} %",
                   default_share=f"{100 * share:.1f} %", default=bt)
        return
    at = int(np.flatnonzero(~fit)[0])
    values = dict(ids=int(counts[at]), tokens=int(inp[at]), block=bt, want=int(-(-inp[at] // bt)),
                  share=f"{100 * share:.1f} %", best=best, best_share=f"{100 * shares[best]:.1f} %")
    if shares[best] >= BLOCK_FIT:
        raise TraceFormatError(trace.name, trace.format, gettext_noop(
            "%(ids)s block ids for %(tokens)s input tokens: %(block)s-token blocks need %(want)s; only %(share)s of the "
            "requests fit %(block)s-token blocks, %(best_share)s fit %(best)s-token blocks: give that block size"),
            int(lines[at]), field_name, **values)
    raise TraceFormatError(trace.name, trace.format, gettext_noop(
        "%(ids)s block ids for %(tokens)s input tokens: %(block)s-token blocks need %(want)s; only %(share)s of the "
        "requests fit %(block)s-token blocks, and no block size from 16 to 2048 tokens fits them"),
        int(lines[at]), field_name, **values)


# ── WEKA kv-cache-tester JSON ────────────────────────────────────────────────────────────────────

def _json_documents(path: Path, name: str, fmt: str) -> Iterator[tuple[int, object]]:
    """(line, object) for a JSON-lines file; a file that is one JSON document (an object, or an array of objects,
    over many lines) yields its objects with line 1."""
    try:
        f = open(path, "rb")
    except OSError as error:
        raise TraceFormatError(name, fmt, gettext_noop("cannot read the trace: %(error)s"),
                               error=error.strerror or error) from None
    with f:
        first_seen = False
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                if first_seen:
                    raise TraceFormatError(name, fmt, gettext_noop("not a JSON object: %(error)s"), number,
                                           error=getattr(error, "msg", error)) from None
                f.seek(0)
                try:
                    whole = json.loads(f.read())
                except (json.JSONDecodeError, UnicodeDecodeError) as error2:
                    raise TraceFormatError(name, fmt, gettext_noop("not JSON: %(error)s (line %(at)s)"), None,
                                           error=getattr(error2, "msg", error2),
                                           at=getattr(error2, "lineno", "?")) from None
                for item in (whole if isinstance(whole, list) else [whole]):
                    yield 1, item
                return
            first_seen = True
            yield number, obj


def _read_weka(path: Path, name: str, block_tokens: int | None) -> Trace:
    """WEKA kv-cache-tester: one conversation per line (or one per file), `requests[]` of normal/streaming calls
    (`t` seconds from the conversation's start, `in`, `out`, `hash_ids`) and subagent markers with requests of their
    own; block ids local to the conversation (`hash_id_scope: local`), `block_size` tokens each."""
    fmt = "weka"
    cols = _Columns()
    counts = array("q")
    ids = array("q")
    sessions: list[str] = []
    size: int | None = None
    conversations = 0
    late = 0
    worst = (0.0, 0)
    for line, conv in _json_documents(path, name, fmt):
        if not isinstance(conv, dict):
            raise TraceFormatError(name, fmt, gettext_noop("not a JSON object"), line)
        for key in ("id", "block_size", "requests"):
            if key not in conv:
                raise TraceFormatError(name, fmt, gettext_noop("missing"), line, key)
        cid = str(conv["id"])
        bs = _whole(conv["block_size"], name, fmt, line, "block_size", 1)
        if size is None:
            size = bs
        elif bs != size:
            raise TraceFormatError(name, fmt, gettext_noop("%(value)s tokens, where the first conversation's blocks "
                                                           "have %(first)s"), line, "block_size", value=bs, first=size)
        scope = conv.get("hash_id_scope", "local")
        if scope not in ("local", "global"):
            raise TraceFormatError(name, fmt, gettext_noop("%(value)s: the scopes are local and global"), line,
                                   "hash_id_scope", value=repr(scope))
        space = conversations if scope == "local" else -1
        if not isinstance(conv["requests"], list):
            raise TraceFormatError(name, fmt, gettext_noop("%(value)s is not a list"), line, "requests",
                                   value=repr(conv["requests"])[:40])
        previous = -math.inf
        for k, entry in enumerate(conv["requests"]):
            where = f"requests[{k}]"
            if not isinstance(entry, dict):
                raise TraceFormatError(name, fmt, gettext_noop("not a JSON object"), line, where)
            kind = entry.get("type")
            if kind == "subagent":
                inner = entry.get("requests")
                if not isinstance(inner, list):
                    raise TraceFormatError(name, fmt, gettext_noop("%(value)s is not a list"), line,
                                           where + ".requests", value=repr(inner)[:40])
                agent = str(entry.get("agent_id", k))
                for j, sub in enumerate(inner):
                    _weka_request(sub, f"{where}.requests[{j}]", f"{cid}::sa:{agent}", space, name, line, cols,
                                  counts, ids, sessions)
                continue
            t = _weka_request(entry, where, cid, space, name, line, cols, counts, ids, sessions)
            if t < previous:
                late += 1
                if previous - t > worst[0]:
                    worst = (previous - t, line)
            previous = max(previous, t)
        conversations += 1
    if size is None:
        raise TraceFormatError(name, fmt, gettext_noop("the trace has no requests"))
    if block_tokens and block_tokens != size:
        raise TraceFormatError(name, fmt, gettext_noop("%(value)s tokens in the file, %(given)s given: the file's "
                                                       "block size is the one its ids were made with"), None,
                               "block_size", value=size, given=block_tokens)
    ts, inp, out, lines = cols.arrays()
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.frombuffer(counts, dtype=np.int64), out=offsets[1:])
    trace = Trace(fmt, name, ts, inp, out, lines, block_offsets=offsets,
                  block_ids=np.frombuffer(ids, dtype=np.int64).copy(), block_tokens=size, reuse_basis="block-ids",
                  session_basis="given", block_tokens_basis="format")
    trace.session, trace.session_names = _dense(sessions)
    if conversations > 1:
        trace.warn(gettext_noop("the format keeps no conversation start times: the %(count)s conversations all start "
                                "at 0 s and are replayed side by side"), None, "t", count=conversations)
    if late:
        trace.warn(gettext_noop("%(count)s request(s) arrive earlier than the request before them in their "
                                "conversation; the largest jump back is %(jump)s s (line %(line)s): they are counted "
                                "in arrival order"), worst[1], "t", count=late, jump=f"{worst[0]:.6g}", line=worst[1])
    return trace


def _weka_request(entry, where: str, session: str, space: int, name: str, line: int, cols: _Columns, counts: array,
                  ids: array, sessions: list) -> float:
    fmt = "weka"
    if not isinstance(entry, dict):
        raise TraceFormatError(name, fmt, gettext_noop("not a JSON object"), line, where)
    if entry.get("type") not in ("n", "s"):
        raise TraceFormatError(name, fmt, gettext_noop("%(value)s: the request types are n, s and subagent"), line,
                               where + ".type", value=repr(entry.get("type")))
    for key in ("t", "in", "out"):
        if key not in entry:
            raise TraceFormatError(name, fmt, gettext_noop("missing"), line, f"{where}.{key}")
    t = _seconds(entry["t"], name, fmt, line, where + ".t")
    inp = _whole(entry["in"], name, fmt, line, where + ".in")
    out = _whole(entry["out"], name, fmt, line, where + ".out")
    hashes = _block_list(entry.get("hash_ids", []), name, fmt, line, where + ".hash_ids")
    if space >= 0:
        for h in hashes:
            if not 0 <= h < (1 << 32):
                raise TraceFormatError(name, fmt, gettext_noop("%(value)s is out of range for a local block id "
                                                               "(0 to 2³² − 1)"), line, where + ".hash_ids", value=h)
        ids.extend((space << 32) | h for h in hashes)
    else:
        ids.extend(hashes)
    counts.append(len(hashes))
    cols.add(t, inp, out, line)
    sessions.append(session)
    return t


# ── Alibaba Bailian usage traces (JSONL) ─────────────────────────────────────────────────────────

def _read_bailian(path: Path, name: str, block_tokens: int | None) -> Trace:
    """Bailian usage traces (alibaba-edu/qwen-bailian-usagetraces-anon, as AIPerf's bailian_trace reads them): one
    request per line, `chat_id`, `parent_chat_id` (−1 for a session's root), `timestamp` in seconds,
    `input_length`, `output_length`, `turn`, `hash_ids` of 16-token blocks (global ids: shared across sessions).
    A follow-up's input counts the whole context the service kept, and its ids cover it."""
    fmt = "bailian"
    cols = _Columns()
    counts = array("q")
    ids = array("q")
    chats: list = []
    parents: list = []
    with_ids = 0
    first_without: int | None = None
    first_with: int | None = None
    for line, obj in _json_documents(path, name, fmt):
        if not isinstance(obj, dict):
            raise TraceFormatError(name, fmt, gettext_noop("not a JSON object"), line)
        for key in ("chat_id", "timestamp", "input_length", "output_length"):
            if key not in obj:
                raise TraceFormatError(name, fmt, gettext_noop("missing"), line, key)
        chat = obj["chat_id"]
        if isinstance(chat, (dict, list, bool)) or chat is None:
            raise TraceFormatError(name, fmt, gettext_noop("%(value)s is not an id"), line, "chat_id", value=repr(chat))
        parent = obj.get("parent_chat_id", -1)
        cols.add(_seconds(obj["timestamp"], name, fmt, line, "timestamp"),
                 _whole(obj["input_length"], name, fmt, line, "input_length"),
                 _whole(obj["output_length"], name, fmt, line, "output_length"), line)
        hashes = obj.get("hash_ids")
        if hashes is None:
            first_without = first_without or line
            hashes = []
        else:
            with_ids += 1
            first_with = first_with or line
            hashes = _block_list(hashes, name, fmt, line)
        counts.append(len(hashes))
        ids.extend(hashes)
        chats.append(str(chat))
        parents.append(None if parent in (-1, "-1", None, "") else str(parent))
    R = len(chats)
    if with_ids and with_ids < R:
        raise TraceFormatError(name, fmt, gettext_noop("missing here, though %(with)s of the %(total)s requests carry "
                                                       "block ids: every request carries them or none does"),
                               first_without, "hash_ids", **{"with": with_ids, "total": R})
    index = {c: i for i, c in enumerate(chats)}
    root = list(range(R))
    orphans = 0
    for i in range(R):
        seen = 0
        j = i
        while parents[j] is not None and seen <= R:
            p = index.get(parents[j])
            if p is None:
                if j == i:
                    orphans += 1
                break
            j = p
            seen += 1
        root[i] = j
    ts, inp, out, lines = cols.arrays()
    _tmp = Trace(fmt, name, ts, inp, out, lines)
    _timestamp_unit(_tmp, "s")
    trace = Trace(fmt, name, ts, inp, out, lines, session_basis="given",
                  block_tokens=block_tokens or BAILIAN_BLOCK_TOKENS, block_tokens_basis="given" if block_tokens
                  else "format")
    trace.session, trace.session_names = _dense([chats[r] for r in root])
    if with_ids:
        trace.block_offsets = np.zeros(R + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(counts, dtype=np.int64), out=trace.block_offsets[1:])
        trace.block_ids = np.frombuffer(ids, dtype=np.int64).copy()
        trace.reuse_basis = "block-ids"
    else:
        trace.reuse_reason = ("the requests carry no hash_ids: a follow-up's input already counts the context the "
                              "service kept, but which tokens it shares with the turn before is not in the file")
    if orphans:
        trace.warn(gettext_noop("%(count)s request(s) name a parent_chat_id that is not in the file: each starts a "
                                "session of its own"), None, "parent_chat_id", count=orphans)
    return trace


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


def _read_azure(path: Path, name: str, block_tokens: int | None) -> Trace:
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

def _read_burstgpt(path: Path, name: str, block_tokens: int | None) -> Trace:
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

def _read_fxpilot(path: Path, name: str, block_tokens: int | None) -> Trace:
    fmt = "fxpilot"
    basis = "given" if block_tokens else "default"
    block_tokens = block_tokens or DEFAULT_BLOCK_TOKENS
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
                  block_tokens=block_tokens, session_basis="given", block_tokens_basis=basis)
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


__all__ = ["FORMATS", "PUBLIC_FORMATS", "plain_file", "DEFAULT_BLOCK_TOKENS", "looks_like", "Trace", "TraceFormatError", "detect_format", "read_trace",
           "read_bytes", "session_prefix_blocks"]
