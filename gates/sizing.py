"""How much FX capacity a customer must buy: pure arithmetic with the source of every number.

    KV bytes per token = 2 (K and V) × layers × KV heads × head dimension × bytes of the KV dtype
    stored            = bytes per token × session tokens (rounded up to LMCache chunks) × sessions retained
                        or, with the trace's reuse curve (docs/traces.md), bytes per token × the LRU capacity in
                        tokens that captures `reuse_share` (0.95) of the trace's reachable reuse
    to buy            = stored × (1 + file-system overhead) × redundancy × (1 + headroom)
    FX100 units       = ⌈to buy ÷ usable bytes of one unit⌉

The model's shape comes from its configuration (config.json: num_hidden_layers, num_key_value_heads,
head_dim); the KV dtype from the setting `kv_cache_dtype`, else the deployment's `--kv-cache-dtype`
flag, else vLLM's default `auto` (the model's activation dtype, bf16 for the FP8 checkpoints named here).
Nothing published states the usable capacity of one FX100, so `fx_unit_usable_tb` has no default: without
it the sizing gives the capacity but no number of units, and says which setting is missing.
`fx_unit_usable_tb_basis` says where the figure comes from: `stated` (the default: the parties set it,
e.g. from the vendor's quote) or `assumed-example` (a figure assumed for a demo, not a published
one — the report says that the unit count rests on it).
"""
from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# From each model's config.json on Hugging Face (num_hidden_layers, num_key_value_heads, head_dim, torch_dtype).
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8": {"layers": 62, "kv_heads": 8, "head_dim": 128, "activation_dtype": "bfloat16"},
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": {"layers": 62, "kv_heads": 8, "head_dim": 128, "activation_dtype": "bfloat16"},
}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "fp16": 2, "bf16": 2, "float32": 4, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "fp8_inc": 1}
TB = 1e12

# Settings a pilot may give (Pilot.sizing); the defaults are stated in the report as defaults.
DEFAULTS: dict[str, Any] = {
    "kv_cache_dtype": None,          # None: from the deployment flags, else vLLM's `auto`
    "chunk_tokens": 256,             # LMCache chunk size: a session's last chunk is stored whole
    "sessions_retained": None,       # None: Pilot.sessions_kept
    "fs_overhead": 0.10,             # file system metadata, allocation slack and free-space reserve of the fs:// pool
    "redundancy": 1.0,               # 1.0: the tested layout (RAID0 pool); 2.0 for a mirrored pool
    "headroom": 0.25,                # growth and operating margin on top
    "fx_unit_usable_tb": None,       # usable TB of one FX100 unit: not published, must be set
    "fx_unit_usable_tb_basis": "stated",  # or "assumed-example": a figure assumed for a demo, not a published one
    "session_statistic": "p90",      # size for the p90 session length (mean also shown)
    "reuse_share": 0.95,             # with the trace's reuse curve: the share of its reachable reuse to capture
}
FRACTIONS = ("fs_overhead", "headroom")
UNIT_BASES = ("stated", "assumed-example")


class SizingSettingsError(ValueError):
    def __init__(self, setting: str, message: str):
        super().__init__(f"sizing setting {setting}: {message}")
        self.setting = setting


def validate_settings(data: Mapping[str, Any] | None) -> dict[str, Any]:
    """The pilot's sizing settings merged over the defaults; an unknown key or a bad value names the setting."""
    data = dict(data or {})
    unknown = sorted(set(data) - set(DEFAULTS) - {"layers", "kv_heads", "head_dim"})
    if unknown:
        raise SizingSettingsError(unknown[0], f"unknown; the settings are {', '.join(sorted(DEFAULTS))}, layers, kv_heads, head_dim")
    out = dict(DEFAULTS)
    for key, value in data.items():
        if value is None:
            out[key] = None
            continue
        if key == "kv_cache_dtype":
            if str(value) not in DTYPE_BYTES and str(value) != "auto":
                raise SizingSettingsError(key, f"{value!r} is not a KV dtype ({', '.join(['auto', *DTYPE_BYTES])})")
            out[key] = str(value)
        elif key == "fx_unit_usable_tb_basis":
            if value not in UNIT_BASES:
                raise SizingSettingsError(key, f"{value!r}: use {' or '.join(UNIT_BASES)}")
            out[key] = value
        elif key == "reuse_share":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise SizingSettingsError(key, f"{value!r} must be a share in (0, 1] (0.95 is 95 %)")
            out[key] = float(value)
        elif key == "session_statistic":
            if value not in ("mean", "p90", "max"):
                raise SizingSettingsError(key, f"{value!r}: use mean, p90 or max")
            out[key] = value
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise SizingSettingsError(key, f"{value!r} is not a number")
            if key in FRACTIONS and not 0 <= value < 10:
                raise SizingSettingsError(key, f"{value} must be a fraction ≥ 0 (0.10 is 10 %)")
            if key == "redundancy" and value < 1:
                raise SizingSettingsError(key, f"{value} must be ≥ 1 (1 is no copy, 2 a mirror)")
            if key in ("chunk_tokens", "sessions_retained", "layers", "kv_heads", "head_dim") and (value < 1 or value != int(value)):
                raise SizingSettingsError(key, f"{value} must be a whole number ≥ 1")
            if key == "fx_unit_usable_tb" and value <= 0:
                raise SizingSettingsError(key, f"{value} must be > 0")
            out[key] = int(value) if key in ("chunk_tokens", "sessions_retained", "layers", "kv_heads", "head_dim") else float(value)
    return out


def kv_dtype_from_flags(flags: Iterable[str]) -> str | None:
    """The value of `--kv-cache-dtype` among vLLM flags (`--kv-cache-dtype fp8` or `--kv-cache-dtype=fp8`)."""
    flags = list(flags)
    for i, flag in enumerate(flags):
        if flag.startswith("--kv-cache-dtype="):
            return flag.split("=", 1)[1]
        if flag == "--kv-cache-dtype" and i + 1 < len(flags):
            return flags[i + 1]
    return None


@dataclass
class SessionLengths:
    """Final context (last turn's prompt + output tokens) of each session, and where they came from."""

    tokens: list[int]
    source: str              # "customer-trace", "sample-trace", "replay-records", "setting", ""
    detail: str = ""

    @property
    def customer(self) -> bool:
        return self.source == "customer-trace"

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.tokens)
        if not ordered:
            return {"sessions": 0, "mean": None, "p50": None, "p90": None, "max": None, "min": None}
        return {"sessions": len(ordered), "mean": statistics.fmean(ordered), "min": ordered[0],
                "p50": quantile(ordered, 0.5), "p90": quantile(ordered, 0.9), "max": ordered[-1]}


def quantile(ordered: list[int], q: float) -> int:
    """The nearest-rank quantile of sorted values (a length that occurred, not a blend of two)."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Sizing:
    model: str
    layers: int | None
    kv_heads: int | None
    head_dim: int | None
    model_source: str
    kv_dtype: str | None
    kv_dtype_source: str
    kv_bytes_per_token: int | None
    sessions: dict[str, Any]
    session_source: str
    session_detail: str
    customer_sessions: bool
    session_statistic: str
    session_tokens: float | None
    chunk_tokens: int
    stored_tokens: int | None
    sessions_retained: int
    sessions_retained_source: str
    fs_overhead: float
    redundancy: float
    headroom: float
    kv_bytes: float | None = None
    capacity_bytes: float | None = None
    fx_unit_usable_tb: float | None = None
    fx_unit_usable_tb_basis: str = "stated"
    fx_units: int | None = None
    missing: list[str] = field(default_factory=list)
    defaults_used: list[str] = field(default_factory=list)
    capacity_basis: str = "session-lengths"     # or "reuse-curve": from the customer's trace's own reuse
    reuse: dict[str, Any] | None = None         # the reuse figures the capacity rests on (reuse_capacity)
    session_formula_bytes: float | None = None  # the session-length formula's figure, for comparison

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def reuse_capacity(reuse: Mapping[str, Any], share: float) -> dict[str, Any] | None:
    """The LRU capacity (tokens) that captures `share` of the reuse a trace allows, from its analysis
    (`gates.traces.analysis.reuse_report`: `capacity_for_share`, else the first point of its `curve` at or above
    the share — never less than needed). None when the trace's reuse is unknown or nothing is reused."""
    if not reuse or not reuse.get("known") or not reuse.get("ideal_hit_fraction"):
        return None
    ideal = float(reuse["ideal_hit_fraction"])
    tokens = (reuse.get("capacity_for_share") or {}).get(str(share))
    if tokens is None:
        above = [p for p in reuse.get("curve") or [] if p["hit_fraction"] >= share * ideal - 1e-12]
        if not above:
            return None
        tokens = min(p["capacity_tokens"] for p in above)
    return {"share": share, "capacity_tokens": int(tokens), "ideal_hit_fraction": ideal,
            "block_tokens": reuse.get("block_tokens"), "curve": list(reuse.get("curve") or []),
            "scale": reuse.get("scale")}


def compute(*, model: str, settings: Mapping[str, Any] | None, vllm_flags: Iterable[str] = (),
            lengths: SessionLengths, sessions_kept: int, reuse: Mapping[str, Any] | None = None) -> Sizing:
    """The capacity to buy and the number of FX100 units, every input with its source.

    With `reuse` (the trace analysis's reuse part, docs/traces.md) the KV bytes are those of the LRU capacity
    that captures `reuse_share` of the trace's reachable reuse; the session-length formula's figure is kept
    beside it (`session_formula_bytes`)."""
    s = validate_settings(settings)
    given = set((settings or {}).keys())
    config = MODEL_CONFIGS.get(model, {})
    layers, kv_heads, head_dim = (s.get(k) or config.get(k) for k in ("layers", "kv_heads", "head_dim"))
    if {"layers", "kv_heads", "head_dim"} & given:
        model_source = "setting"
    elif config:
        model_source = "config.json"
    else:
        model_source = ""
    missing = [] if (layers and kv_heads and head_dim) else ["layers", "kv_heads", "head_dim"]
    dtype, dtype_source = s["kv_cache_dtype"], "setting"
    if not dtype:
        dtype, dtype_source = kv_dtype_from_flags(vllm_flags), "vllm-flag"
    if not dtype:
        dtype, dtype_source = "auto", "vllm-default"
    if dtype == "auto":
        dtype = config.get("activation_dtype")
        dtype_source = dtype_source if dtype_source != "setting" else "setting-auto"
        if dtype is None:
            missing.append("kv_cache_dtype")
    dtype_bytes = DTYPE_BYTES.get(dtype or "")
    per_token = 2 * layers * kv_heads * head_dim * dtype_bytes if (layers and kv_heads and head_dim and dtype_bytes) else None
    summary = lengths.summary()
    statistic = s["session_statistic"]
    session_tokens = summary.get(statistic)
    chunk = s["chunk_tokens"]
    stored_tokens = int(math.ceil(session_tokens / chunk) * chunk) if session_tokens else None
    retained = s["sessions_retained"] or sessions_kept
    result = Sizing(
        model=model, layers=layers, kv_heads=kv_heads, head_dim=head_dim, model_source=model_source,
        kv_dtype=dtype, kv_dtype_source=dtype_source, kv_bytes_per_token=per_token, sessions=summary,
        session_source=lengths.source, session_detail=lengths.detail, customer_sessions=lengths.customer,
        session_statistic=statistic, session_tokens=session_tokens, chunk_tokens=chunk, stored_tokens=stored_tokens,
        sessions_retained=retained, sessions_retained_source="setting" if s["sessions_retained"] else "pilot",
        fs_overhead=s["fs_overhead"], redundancy=s["redundancy"], headroom=s["headroom"],
        fx_unit_usable_tb=s["fx_unit_usable_tb"], fx_unit_usable_tb_basis=s["fx_unit_usable_tb_basis"] or "stated",
        missing=missing,
        defaults_used=[k for k in ("fs_overhead", "redundancy", "headroom", "chunk_tokens") if k not in given],
    )
    if not stored_tokens:
        result.missing.append("session lengths")
    overhead = (1 + s["fs_overhead"]) * s["redundancy"] * (1 + s["headroom"])
    if per_token and stored_tokens:
        result.kv_bytes = float(per_token) * stored_tokens * retained
        result.capacity_bytes = result.kv_bytes * overhead
    from_reuse = reuse_capacity(reuse, s["reuse_share"]) if reuse is not None else None
    if per_token and from_reuse:
        result.session_formula_bytes = result.capacity_bytes
        result.capacity_basis, result.reuse = "reuse-curve", from_reuse
        result.kv_bytes = float(per_token) * from_reuse["capacity_tokens"]
        result.capacity_bytes = result.kv_bytes * overhead
        if "session lengths" in result.missing:
            result.missing.remove("session lengths")
    if result.capacity_bytes:
        if s["fx_unit_usable_tb"]:
            result.fx_units = max(1, math.ceil(result.capacity_bytes / (s["fx_unit_usable_tb"] * TB)))
        else:
            result.missing.append("fx_unit_usable_tb")
    return result


def trace_session_lengths(turns: Iterable[Any]) -> list[int]:
    """Final context of each session of a trace (turn n's prompt extends turn n−1's): its last turn's prompt + output."""
    last: dict[str, tuple[int, int]] = {}
    for t in turns:
        if t.session_id not in last or t.turn > last[t.session_id][0]:
            last[t.session_id] = (t.turn, t.prompt_tokens + t.output_tokens)
    return [tokens for _, tokens in last.values()]


HISTOGRAM_EDGES = (1024, 4096, 8192, 16384, 32768, 65536, 131072, 262144)


def length_summary(tokens: list[int]) -> dict[str, Any]:
    """Session-length statistics and a histogram ([upper edge in tokens or None, sessions]) for people and sizing."""
    ordered = sorted(tokens)
    if not ordered:
        return {}
    counts, lower = [], 0
    for edge in (*HISTOGRAM_EDGES, None):
        count = sum(1 for t in ordered if t > lower and (edge is None or t <= edge))
        counts.append([edge, count])
        if edge is None or edge >= ordered[-1]:
            break
        lower = edge
    counts = [row for row in counts if row[1]] or counts
    return {"mean": statistics.fmean(ordered), "min": ordered[0], "p50": quantile(ordered, 0.5),
            "p90": quantile(ordered, 0.9), "max": ordered[-1], "histogram": counts}


@dataclass
class Turn:
    """One turn of a session as a trace gives it (fxpilot's CSV, or a public format's request)."""

    session_id: str
    turn: int
    prompt_tokens: int
    output_tokens: int


def trace_csv_session_lengths(data: bytes) -> list[int]:
    """Session lengths of a trace CSV already validated when it was kept (rows that do not parse are skipped)."""
    turns = []
    for row in csv.DictReader(io.StringIO(data.decode("utf-8-sig", errors="replace"))):
        try:
            turns.append(Turn(row["session_id"].strip(), int(row["turn"]), int(row["prompt_tokens"]),
                               int(row["output_tokens"])))
        except (KeyError, ValueError, AttributeError):
            continue
    return trace_session_lengths(turns)
