"""Reading the judge's inputs: request records, vllm bench JSON, retrieval records, phase summaries,
node inventories. Files are recognised by their schema; every error names the file, the line and
the field (docs/contracts.md §1–3).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gates.judge import lmcache_log
from gates.judge.lazy import pd

REQUEST_SCHEMA = "fxpilot.request/1"
RETRIEVE_SCHEMA = "fxpilot.retrieve/1"
PHASE_SCHEMA = "fxpilot.phase/1"
INVENTORY_SCHEMA = "fxpilot.inventory/1"
# what G4's replay step chose and its oracle (runners.tracereplay): the reuse the replayed requests allow, per
# stratum, and the capped replay's cap and predicted hit share (gates.traces.capacity)
REPLAY_SAMPLE_SCHEMA = "fxpilot.replay-sample/1"
SCHEMAS = (REQUEST_SCHEMA, RETRIEVE_SCHEMA, PHASE_SCHEMA, INVENTORY_SCHEMA, REPLAY_SAMPLE_SCHEMA)
RECORD_PHASES = ("populate", "measure", "probe", "replay", "soak", "fault", "recovery", "share", "capacity")

# field → (allowed Python types, may be null); ints are accepted where floats are expected
_INT, _FLOAT, _STR, _BOOL = (int,), (int, float), (str,), (bool,)
REQUEST_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "schema": (_STR, False), "run_id": (_STR, False), "arm": (_STR, False), "instance": (_STR, False),
    "phase": (_STR, False), "concurrency": (_INT, False), "repetition": (_INT, False), "session": (_STR, False),
    "prompt_tokens": (_INT, False), "cached_tokens": (_INT, True), "output_tokens": (_INT, False),
    "t_send": (_FLOAT, False), "t_first_token": (_FLOAT, True), "t_end": (_FLOAT, False),
    "wall_anchor": (_FLOAT, False), "status": (_STR, False), "error": (_STR, True), "simulated": (_BOOL, False),
}
REQUEST_OPTIONAL: dict[str, tuple[tuple[type, ...], bool]] = {
    "output_sha256": (_STR, True), "turn": (_INT, True), "client_cpu_s": (_FLOAT, True),
    "stratum": (_STR, True),   # a replayed request's stratum: first | shared_prefix | returning (gates.traces)
    # the replay's global send order (the capacity check recomputes its oracle in it), and an open-loop request's
    # due time and lateness on the client's clock (gates.judge.metrics measures a real server's latency from it)
    "send_seq": (_INT, True), "t_scheduled": (_FLOAT, True), "send_lateness_s": (_FLOAT, True),
}
RETRIEVE_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "schema": (_STR, False), "run_id": (_STR, False), "arm": (_STR, False), "instance": (_STR, False),
    "gpu": (_INT, False), "tokens": (_INT, False), "bytes": (_INT, True), "seconds": (_FLOAT, True),
    "gbps": (_FLOAT, True), "simulated": (_BOOL, False),
}
# optional: whether the line carried size and throughput (absent: it did when gbps is given), and the storage that
# served the retrieval (absent or null: not attributed; read_bw counts only retrievals its arm's own tier served)
RETRIEVE_OPTIONAL: dict[str, tuple[tuple[type, ...], bool]] = {"bandwidth_logged": (_BOOL, False), "tier": (_STR, True)}
RETRIEVE_COLUMNS = list(RETRIEVE_FIELDS) + list(RETRIEVE_OPTIONAL)
PHASE_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "schema": (_STR, False), "arm": (_STR, False), "phase": (_STR, False), "concurrency": (_INT, False),
    "repetition": (_INT, False), "simulated": (_BOOL, False),
}
PHASE_OPTIONAL: dict[str, tuple[tuple[type, ...], bool]] = {
    "requests": (_INT, True), "duration_s": (_FLOAT, True), "client_cpu_s": (_FLOAT, True),
    "max_in_flight": (_INT, True), "metrics_before": ((dict,), True), "metrics_after": ((dict,), True),
    "versions": ((dict,), True),
}
INVENTORY_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "schema": (_STR, False), "node": (_STR, False), "simulated": (_BOOL, False),
}
REQUEST_COLUMNS = list(REQUEST_FIELDS) + list(REQUEST_OPTIONAL)
# the canonical order of request rows: the judge's results never depend on the order records arrive in
CANONICAL_ORDER = ["arm", "phase", "concurrency", "repetition", "t_send", "t_end", "t_first_token", "session",
                   "output_tokens", "prompt_tokens"]


def plain(value: Any) -> Any:
    """numpy scalars as Python numbers, so messages say 1114.11, not np.float64(1114.11)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value) if not math.isnan(value) else value
    return value


class RecordError(ValueError):
    """Input the judge cannot use. Says which file, which line and which field, and what was wrong."""

    def __init__(self, source: str, message: str, *, line: int | None = None, field: str | None = None):
        self.source, self.line, self.field, self.message = source, line, field, message
        where = source
        if line is not None:
            where += f", line {line}"
        if field:
            where += f", field {field!r}"
        super().__init__(f"{where}: {message}")


@dataclass
class Inputs:
    """Everything the judge reads, validated; request rows in canonical order."""

    requests: pd.DataFrame
    retrieves: pd.DataFrame
    summaries: list[dict] = field(default_factory=list)
    inventories: list[dict] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)   # fxpilot.replay-sample/1, by source name

    def sources(self, kind: str) -> list[str]:
        return sorted(name for name, k in self.kinds.items() if k == kind)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _type_name(types: tuple[type, ...]) -> str:
    return {_INT: "a whole number", _FLOAT: "a number", _STR: "text", _BOOL: "true or false"}.get(
        types, " or ".join(t.__name__ for t in types))


def check_fields(record: dict, fields: dict, source: str, line: int | None, *, required: bool = True) -> None:
    """Type-check one JSON object against a field table; bools are never numbers."""
    for name, (types, nullable) in fields.items():
        if name not in record:
            if required:
                raise RecordError(source, "missing", line=line, field=name)
            continue
        value = record[name]
        if value is None:
            if not nullable:
                raise RecordError(source, "is null but must be " + _type_name(types), line=line, field=name)
            continue
        if isinstance(value, bool) and bool not in types:
            raise RecordError(source, f"{value!r} is not {_type_name(types)}", line=line, field=name)
        if not isinstance(value, types):
            raise RecordError(source, f"{value!r} is not {_type_name(types)}", line=line, field=name)
        if isinstance(value, float) and not math.isfinite(value):
            raise RecordError(source, f"{value!r} is not a finite number", line=line, field=name)


def _decode(source: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RecordError(source, f"not UTF-8 text (byte {error.start})") from None


def _json_lines(source: str, text: str) -> list[tuple[int, dict]]:
    rows = []
    lines = text.split("\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as error:
            hint = " (the line looks truncated)" if number == len(lines) and not text.endswith("\n") else ""
            raise RecordError(source, f"not JSON: {error.msg} at column {error.colno}{hint}", line=number) from None
        if not isinstance(value, dict):
            raise RecordError(source, "each line must be a JSON object", line=number)
        rows.append((number, value))
    return rows


def _check_schema(source: str, line: int | None, obj: dict, expected: str) -> None:
    schema = obj.get("schema")
    if schema != expected:
        raise RecordError(source, f"{schema!r} where {expected!r} was expected (all lines of a file share one schema)",
                          line=line, field="schema")


def _request_rows(source: str, rows: list[tuple[int, dict]]) -> pd.DataFrame:
    checked: set[tuple] = set()
    names = list(REQUEST_FIELDS) + list(REQUEST_OPTIONAL)
    for line, obj in rows:
        _check_schema(source, line, obj, REQUEST_SCHEMA)
        # one full check per distinct shape of record keeps a million lines fast
        signature = tuple(type(obj.get(n, KeyError)) for n in names)
        if signature not in checked:
            check_fields(obj, REQUEST_FIELDS, source, line)
            check_fields(obj, REQUEST_OPTIONAL, source, line, required=False)
            checked.add(signature)
        else:
            for name in ("t_send", "t_first_token", "t_end", "wall_anchor", "client_cpu_s"):
                value = obj.get(name)
                if isinstance(value, float) and not math.isfinite(value):
                    raise RecordError(source, f"{value!r} is not a finite number", line=line, field=name)
    frame = pd.DataFrame.from_records([obj for _, obj in rows], columns=REQUEST_COLUMNS)
    frame["_source"] = source
    frame["_line"] = np.array([line for line, _ in rows], dtype=np.int64)
    caps = [obj.get("concurrency_cap") for _, obj in rows]
    if any(cap is not None for cap in caps):
        # an open-loop replay's records carry the measured most in flight as `concurrency` and the client's cap as
        # `concurrency_cap` (issue 44, item 5): cells are keyed on the cap, one per arm whatever each repetition
        # measured, and the measured figure is kept for the labels (`_in_flight_max`)
        for (line, _), cap in zip(rows, caps, strict=True):
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
                raise RecordError(source, f"{cap!r} is not a concurrency cap (a whole number ≥ 1)", line=line,
                                  field="concurrency_cap")
        capped = np.array([cap is not None for cap in caps])
        frame["_in_flight_max"] = np.where(capped, pd.to_numeric(frame["concurrency"], errors="coerce"), np.nan)
        frame["concurrency"] = [cap if cap is not None else c for cap, c in zip(caps, frame["concurrency"], strict=True)]
    return frame


def normalise_requests(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    """Give request rows their dtypes and check the values; the first bad row is named by its line."""
    frame = frame.copy()
    if "_line" not in frame:
        frame["_line"] = np.arange(1, len(frame) + 1, dtype=np.int64)
    if "_source" not in frame:
        frame["_source"] = source
    for name in REQUEST_FIELDS:
        if name not in frame:
            raise RecordError(source, "missing", line=int(frame["_line"].iloc[0]) if len(frame) else None, field=name)
    for name in REQUEST_OPTIONAL:
        if name not in frame:
            frame[name] = None

    def fail(mask: pd.Series | np.ndarray, name: str, message: str) -> None:
        mask = np.asarray(mask, dtype=bool)
        if mask.any():
            row = frame.iloc[int(np.argmax(mask))]
            raise RecordError(str(row["_source"]), f"{plain(row[name])!r} {message}", line=int(row["_line"]), field=name)

    fail(frame["schema"] != REQUEST_SCHEMA, "schema", f"is not {REQUEST_SCHEMA!r}")
    for name in ("concurrency", "repetition", "prompt_tokens", "output_tokens"):
        values = pd.to_numeric(frame[name], errors="coerce")
        fail(values.isna() | (values != values.round()), name, "is not a whole number")
        frame[name] = values.astype(np.int64)
    for name in ("cached_tokens", "turn", "t_first_token", "client_cpu_s"):
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype(np.float64)
    for name in ("t_send", "t_end", "wall_anchor"):
        values = pd.to_numeric(frame[name], errors="coerce").astype(np.float64)
        fail(~np.isfinite(values), name, "is not a finite number")
        frame[name] = values
    fail(frame["concurrency"] < 1, "concurrency", "must be at least 1")
    fail(frame["repetition"] < 1, "repetition", "must be at least 1 (repetitions count from 1)")
    fail(frame["prompt_tokens"] < 0, "prompt_tokens", "must not be negative")
    fail(frame["output_tokens"] < 0, "output_tokens", "must not be negative")
    fail(frame["cached_tokens"] < 0, "cached_tokens", "must not be negative")
    fail(frame["cached_tokens"] > frame["prompt_tokens"], "cached_tokens", "is more than prompt_tokens")
    fail(~frame["status"].isin(["ok", "error"]), "status", "is neither 'ok' nor 'error'")
    fail(~frame["phase"].isin(RECORD_PHASES), "phase", f"is not a phase ({', '.join(RECORD_PHASES)})")
    fail(frame["arm"].astype(str).str.len() == 0, "arm", "is empty")
    fail(frame["t_end"] < frame["t_send"], "t_end", "is earlier than t_send")
    fail(frame["t_first_token"] < frame["t_send"], "t_first_token", "is earlier than t_send")
    fail(frame["t_first_token"] > frame["t_end"], "t_first_token",
         "is later than t_end (a first token after the request ended): the timestamps are out of order")
    if frame["simulated"].dtype != bool:
        fail(frame["simulated"].map(lambda v: not isinstance(v, (bool, np.bool_))), "simulated", "is not true or false")
        frame["simulated"] = frame["simulated"].astype(bool)
    for name in ("run_id", "arm", "instance", "phase", "session", "status"):
        frame[name] = frame[name].astype(str)
    return frame


def _retrieve_rows(source: str, rows: list[tuple[int, dict]]) -> pd.DataFrame:
    for line, obj in rows:
        _check_schema(source, line, obj, RETRIEVE_SCHEMA)
        check_fields(obj, RETRIEVE_FIELDS, source, line)
        check_fields(obj, RETRIEVE_OPTIONAL, source, line, required=False)
        for name in ("gbps", "seconds"):
            if obj[name] is not None and obj[name] < 0:
                raise RecordError(source, "must not be negative", line=line, field=name)
        logged = obj.get("bandwidth_logged", obj["gbps"] is not None)
        if logged and obj["gbps"] is None:
            raise RecordError(source, "bandwidth_logged is true but gbps is null", line=line, field="gbps")
    frame = pd.DataFrame.from_records([{**obj, "bandwidth_logged": obj.get("bandwidth_logged", obj["gbps"] is not None),
                                        "tier": obj.get("tier")} for _, obj in rows], columns=RETRIEVE_COLUMNS)
    frame["_source"] = source
    frame["_line"] = [line for line, _ in rows]
    return frame


def _phase_rows(source: str, rows: list[tuple[int, dict]]) -> list[dict]:
    out = []
    for line, obj in rows:
        _check_schema(source, line, obj, PHASE_SCHEMA)
        check_fields(obj, PHASE_FIELDS, source, line)
        check_fields(obj, PHASE_OPTIONAL, source, line, required=False)
        for key in ("metrics_before", "metrics_after"):
            for name, value in (obj.get(key) or {}).items():
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise RecordError(source, f"{value!r} is not a number", line=line, field=f"{key}.{name}")
        cap = obj.get("concurrency_cap")
        if cap is not None:
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise RecordError(source, f"{cap!r} is not a concurrency cap (a whole number ≥ 1)", line=line,
                                  field="concurrency_cap")
            # keyed on the cap like its records (an open-loop replay's measured concurrency is in in_flight)
            obj = {**obj, "concurrency": cap, "_concurrency_measured": obj["concurrency"]}
        out.append({**obj, "_source": source, "_line": line})
    return out


def _inventory(source: str, obj: dict, line: int | None = None) -> dict:
    _check_schema(source, line, obj, INVENTORY_SCHEMA)
    check_fields(obj, INVENTORY_FIELDS, source, line)
    return {**obj, "_source": source}


def from_vllm_bench(source: str, data: dict) -> pd.DataFrame:
    """`vllm bench serve --save-result --save-detailed` JSON → request rows.

    Arm, phase and repetition come from `--metadata arm=fx phase=measure repetition=1` (top-level keys);
    concurrency from max_concurrency. start_times are perf_counter seconds, so wall_anchor is unknown (0).
    """
    needed = ("start_times", "ttfts", "input_lens", "output_lens", "errors")
    missing = [key for key in needed if key not in data]
    if missing:
        raise RecordError(source, "a vllm bench serve result without its per-request arrays "
                          f"({', '.join(missing)} missing): rerun with --save-result --save-detailed",
                          field=missing[0])
    count = len(data["start_times"])
    lengths = {key: len(data[key]) for key in needed if isinstance(data[key], list)}
    for key in needed:
        if not isinstance(data[key], list) or len(data[key]) != count:
            raise RecordError(source, f"has {lengths.get(key, 'no')} entries where start_times has {count}", field=key)
    arm = data.get("arm")
    if not isinstance(arm, str) or not arm:
        raise RecordError(source, "no arm: run vllm bench serve with --metadata arm=<recompute|local_nvme|fx>", field="arm")
    concurrency = data.get("max_concurrency")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise RecordError(source, f"{concurrency!r} is not a concurrency: run with --max-concurrency N", field="max_concurrency")
    try:
        repetition = int(data.get("repetition", 1))
    except (TypeError, ValueError):
        raise RecordError(source, f"{data.get('repetition')!r} is not a whole number", field="repetition") from None
    latencies = data.get("latencies") if isinstance(data.get("latencies"), list) else None
    itls = data.get("itls") if isinstance(data.get("itls"), list) else None
    texts = data.get("generated_texts") if isinstance(data.get("generated_texts"), list) else None
    simulated = str(data.get("simulated", "false")).lower() in ("true", "1", "yes")
    rows = []

    def number(key: str, i: int, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RecordError(source, f"{value!r} is not a number", field=f"{key}[{i}]")
        return float(value)

    for i in range(count):
        start = number("start_times", i, data["start_times"][i])
        ttft = number("ttfts", i, data["ttfts"][i])
        error = data["errors"][i] or ""
        ok = error == ""
        if latencies is not None and i < len(latencies):
            end = start + number("latencies", i, latencies[i])
        elif itls is not None and i < len(itls):
            end = start + ttft + sum(number("itls", i, gap) for gap in itls[i] or [])
        else:
            end = start + ttft
        text = texts[i] if texts is not None and i < len(texts) else None
        rows.append({
            "schema": REQUEST_SCHEMA, "run_id": str(data.get("run_id") or data.get("label") or Path(source).stem),
            "arm": arm, "instance": str(data.get("instance", "")), "phase": str(data.get("phase", "measure")),
            "concurrency": concurrency, "repetition": repetition, "session": str(data.get("session_prefix", "")) + str(i),
            "prompt_tokens": data["input_lens"][i], "cached_tokens": None, "output_tokens": data["output_lens"][i],
            "t_send": start, "t_first_token": start + ttft if ok else None, "t_end": max(end, start),
            "wall_anchor": 0.0, "status": "ok" if ok else "error", "error": None if ok else str(error),
            "simulated": simulated, "turn": None, "client_cpu_s": None,
            "output_sha256": hashlib.sha256(text.encode()).hexdigest() if ok and isinstance(text, str) else None,
            "_source": source, "_line": i + 1,
        })
    frame = pd.DataFrame.from_records(rows)
    return normalise_requests(frame, source)


def classify(source: str, data: bytes) -> tuple[str, Any]:
    """What a file is, by its schema: ('requests'|'retrieve'|'phase-summary', rows), ('inventory', [objs]),
    ('vllm-bench', obj) or ('lmcache-log', text)."""
    text = _decode(source, data)
    stripped = text.strip()
    if not stripped:
        raise RecordError(source, "the file is empty")
    kinds = {REQUEST_SCHEMA: "requests", RETRIEVE_SCHEMA: "retrieve", PHASE_SCHEMA: "phase-summary",
             INVENTORY_SCHEMA: "inventory"}
    if stripped[0] in "[{":
        try:
            whole = json.loads(stripped)
        except json.JSONDecodeError:
            whole = None  # JSON Lines with more than one line, or broken: read line by line below
        if isinstance(whole, dict) and (whole.get("schema") == REPLAY_SAMPLE_SCHEMA or (
                whole.get("schema") is None and "sampled_requests" in whole and "oracle" in whole)):
            return "replay-sample", whole   # (replay samples stored before the schema was written have none)
        if isinstance(whole, dict) and whole.get("schema") is None and any(
                key in whole for key in ("max_concurrency", "num_prompts", "ttfts", "completed")):
            return "vllm-bench", whole
        if isinstance(whole, dict):
            whole = [whole]
        if isinstance(whole, list) and whole and all(isinstance(item, dict) for item in whole):
            first_schema = whole[0].get("schema")
            kind = kinds.get(first_schema) if isinstance(first_schema, str) else None
            if kind is None:
                raise RecordError(source, f"unknown schema {whole[0].get('schema')!r}; the judge reads "
                                  f"{', '.join(SCHEMAS)} and vllm bench serve --save-detailed JSON", field="schema")
            rows = list(enumerate(whole, start=1))
            return kind, [obj for _, obj in rows] if kind == "inventory" else rows
    elif lmcache_log.looks_like_log(text):
        return "lmcache-log", text
    rows = _json_lines(source, text)
    first_line, first = rows[0]
    schema = first.get("schema")
    kind = kinds.get(schema) if isinstance(schema, str) else None
    if kind is None:
        raise RecordError(source, f"unknown schema {schema!r}; the judge reads {', '.join(SCHEMAS)} "
                          "and vllm bench serve --save-detailed JSON", line=first_line, field="schema")
    if kind == "inventory":
        return kind, [obj for _, obj in rows]
    return kind, rows


@dataclass
class _Collected:
    requests: list[pd.DataFrame] = field(default_factory=list)
    retrieves: list[pd.DataFrame] = field(default_factory=list)
    summaries: list[dict] = field(default_factory=list)
    inventories: list[dict] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)


def _add_file(out: _Collected, name: str, data: bytes) -> None:
    if name in out.digests:
        raise RecordError(name, "given twice")
    out.digests[name] = sha256(data)
    kind, payload = classify(name, data)
    out.kinds[name] = kind
    if kind == "requests":
        out.requests.append(normalise_requests(_request_rows(name, payload), name))
    elif kind == "vllm-bench":
        out.requests.append(from_vllm_bench(name, payload))
        out.kinds[name] = "requests"
    elif kind == "retrieve":
        out.retrieves.append(_retrieve_rows(name, payload))
    elif kind == "lmcache-log":
        raise RecordError(name, "an LMCache log: convert it first with gates.judge.lmcache_log.parse_log "
                          "(it needs the arm and run id the log does not carry)")
    elif kind == "phase-summary":
        out.summaries.extend(_phase_rows(name, payload))
    elif kind == "replay-sample":
        out.samples.append({**payload, "_source": name})
    else:
        out.inventories.extend(_inventory(name, obj, line=None if len(payload) == 1 else i + 1)
                               for i, obj in enumerate(payload))


def _frame_digest(frame: pd.DataFrame) -> str:
    """SHA-256 over each column in turn: numbers by their bytes, text by pandas' stable hash."""
    digest = hashlib.sha256()
    for name in frame.columns:
        column = frame[name]
        digest.update(name.encode() + b"\0")
        if column.dtype.kind in "biuf":
            digest.update(column.to_numpy().tobytes())
        else:
            digest.update(pd.util.hash_pandas_object(column.astype(object), index=False).to_numpy().tobytes())
    return digest.hexdigest()


CATEGORIES = ("arm", "phase", "status")


def canonical_order(requests: pd.DataFrame) -> pd.DataFrame:
    """Request rows in one order whatever order they came in; repeated text columns become categories
    (lexically ordered, so their codes sort like the text)."""
    requests = requests.assign(**{name: pd.Categorical(requests[name].astype(str)) for name in CATEGORIES})
    keys = [requests[name].cat.codes.to_numpy() if name in CATEGORIES else requests[name].to_numpy()
            for name in CANONICAL_ORDER if name != "session"]
    order = np.lexsort(keys[::-1])
    tied = np.ones(max(len(order) - 1, 0), dtype=bool)
    for key in keys:
        ordered = key[order]
        same = ordered[1:] == ordered[:-1]
        if ordered.dtype.kind == "f":
            same |= np.isnan(ordered[1:]) & np.isnan(ordered[:-1])
        tied &= same
    if tied.any():  # rows equal on every timing key: let the session and the rest decide
        return requests.sort_values(CANONICAL_ORDER + ["output_sha256", "_source", "_line"], kind="stable",
                                    na_position="last").reset_index(drop=True)
    return requests.take(order).reset_index(drop=True)


def load_inputs(items: list | tuple) -> Inputs:
    """Files (paths), (name, bytes) pairs, request DataFrames or already-parsed dicts → validated Inputs."""
    out = _Collected()
    for position, item in enumerate(items, start=1):
        if isinstance(item, (str, Path)):
            name = str(item)
            try:
                data = Path(item).read_bytes()
            except OSError as error:
                raise RecordError(name, f"cannot be read: {error.strerror}") from None
            _add_file(out, name, data)
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], (bytes, bytearray)):
            _add_file(out, str(item[0]), bytes(item[1]))
        elif isinstance(item, pd.DataFrame):
            name = str(item.attrs.get("name") or f"<frame {position}>")
            frame = normalise_requests(item, name)
            out.digests[name] = _frame_digest(frame[REQUEST_COLUMNS])
            out.kinds[name] = "requests"
            out.requests.append(frame)
        elif isinstance(item, dict):
            name = str(item.get("_source") or f"<object {position}>")
            kind = {INVENTORY_SCHEMA: "inventory", PHASE_SCHEMA: "phase-summary",
                    REPLAY_SAMPLE_SCHEMA: "replay-sample"}.get(item.get("schema"))
            if kind is None:
                raise RecordError(name, f"unknown schema {item.get('schema')!r}", field="schema")
            out.kinds[name] = kind
            if kind == "replay-sample":
                out.samples.append({**item, "_source": name})
            elif kind == "inventory":
                out.inventories.append(_inventory(name, item))
            else:
                out.summaries.extend(_phase_rows(name, [(1, item)]))
        else:
            raise RecordError(f"<input {position}>", f"cannot read a {type(item).__name__}; give a path, "
                              "(name, bytes), a DataFrame of request records or a JSON object")
    requests = (pd.concat(out.requests, ignore_index=True) if out.requests
                else normalise_requests(pd.DataFrame(columns=REQUEST_COLUMNS), "<none>"))
    requests = canonical_order(requests)
    retrieves = (pd.concat(out.retrieves, ignore_index=True) if out.retrieves
                 else pd.DataFrame(columns=RETRIEVE_COLUMNS + ["_source", "_line"]))
    if len(retrieves):
        retrieves = retrieves.sort_values(["arm", "gbps", "gpu", "_source", "_line"], kind="stable").reset_index(drop=True)
    summaries = sorted(out.summaries, key=lambda s: (s["arm"], s["phase"], s["concurrency"], s["repetition"],
                                                     s["_source"], s["_line"]))
    inventories = sorted(out.inventories, key=lambda i: (i["node"], i["_source"]))
    samples = sorted(out.samples, key=lambda sample: sample["_source"])
    return Inputs(requests=requests, retrieves=retrieves, summaries=summaries, inventories=inventories,
                  digests=dict(sorted(out.digests.items())), kinds=out.kinds, samples=samples)
