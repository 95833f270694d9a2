"""A customer's own measurement of his current setup, attached to a pilot for comparison (docs/results.md).

Accepted: a vLLM `bench serve --save-result` JSON (with or without --save-detailed) or an AIPerf
`profile_export_aiperf.json` (schema up to 1.4, AIPerf 0.13). The file is validated (an error names the file and the
field), stored whole in the evidence store under its SHA-256 (runners.artifacts), and described by a manifest stored
beside it in the same store at `attachments/<pilot code>/<manifest sha256>.json`; both are hashed again on every read.
No model changes: nothing is added to the database. Each is labelled "customer's own measurement, not fxpilot
evidence", and never judged.
"""
from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

from django.utils.translation import gettext_noop

from gates.models import Pilot
from runners.artifacts import ArtifactMismatch, evidence_storage, get_bytes, put_bytes, sha256_bytes
from runners.models import artifact_storage_name

MANIFEST_SCHEMA = "fxpilot.customer-measurement/1"
LABEL = gettext_noop("customer's own measurement, not fxpilot evidence")
NEWEST_AIPERF_SCHEMA = (1, 4)   # AIPerf 0.13.0's JsonExportData.SCHEMA_VERSION
# vLLM bench serve: the summary keys a comparison needs (milliseconds, as vLLM writes them)
VLLM_REQUIRED = ("completed", "duration", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms")
VLLM_DETAIL = ("ttfts", "input_lens", "output_lens", "errors")
AIPERF_STAT_KEYS = ("avg", "min", "max", "std", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99")


class AttachError(ValueError):
    """A file that cannot be attached; the message names the file and the field."""

    def __init__(self, source: str, message: str, field: str | None = None):
        self.source, self.field = source, field
        super().__init__(f"{source}" + (f", field {field!r}" if field else "") + f": {message}")


def _number(source: str, data: dict, key: str, *, where: str = "") -> float:
    value = data.get(key)
    name = f"{where}{key}"
    if key not in data:
        raise AttachError(source, "missing", name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AttachError(source, f"{value!r} is not a number", name)
    return float(value)


def _vllm_summary(source: str, data: dict) -> dict:
    for key in VLLM_REQUIRED:
        _number(source, data, key)
    if data["completed"] < 1:
        raise AttachError(source, "no completed request", "completed")
    present = [key for key in VLLM_DETAIL if key in data]
    if present:
        count = None
        for key in VLLM_DETAIL:
            if key not in data:
                raise AttachError(source, f"missing while {', '.join(present)} is present (--save-detailed)", key)
            if not isinstance(data[key], list):
                raise AttachError(source, "is not a list", key)
            count = len(data[key]) if count is None else count
            if len(data[key]) != count:
                raise AttachError(source, f"has {len(data[key])} entries where {VLLM_DETAIL[0]} has {count}", key)
    summary = {"ttft_ms": {"avg": data["mean_ttft_ms"], "p50": data["median_ttft_ms"], "p99": data["p99_ttft_ms"]},
               "requests": int(data["completed"]), "duration_s": float(data["duration"])}
    for ours, theirs in (("itl_ms", "itl"), ("tpot_ms", "tpot"), ("latency_ms", "e2el")):
        figures = {k: data[f"{pre}_{theirs}_ms"] for k, pre in (("avg", "mean"), ("p50", "median"), ("p99", "p99"))
                   if isinstance(data.get(f"{pre}_{theirs}_ms"), (int, float))}
        if figures:
            summary[ours] = figures
    for key in ("request_throughput", "output_throughput", "max_concurrency", "model_id", "backend", "date"):
        if data.get(key) is not None:
            summary[key] = data[key]
    return summary


def _aiperf_summary(source: str, data: dict) -> dict:
    version = data.get("schema_version")
    if version is not None:
        try:
            parsed = tuple(int(part) for part in str(version).split("."))
        except ValueError:
            raise AttachError(source, f"{version!r} is not a schema version", "schema_version") from None
        if parsed > NEWEST_AIPERF_SCHEMA:
            raise AttachError(source, f"schema {version} is newer than the newest fxpilot reads "
                              f"({'.'.join(map(str, NEWEST_AIPERF_SCHEMA))}, AIPerf 0.13)", "schema_version")
    summary: dict = {"aiperf_version": data.get("aiperf_version"), "schema_version": version}
    ttft = data.get("time_to_first_token")
    if not isinstance(ttft, dict):
        raise AttachError(source, "missing (an AIPerf export without its TTFT)", "time_to_first_token")
    for tag, ours in (("time_to_first_token", "ttft_ms"), ("inter_token_latency", "itl_ms"),
                      ("request_latency", "latency_ms"), ("request_throughput", "request_throughput"),
                      ("output_token_throughput", "output_throughput"), ("request_count", "requests")):
        metric = data.get(tag)
        if metric is None:
            continue
        if not isinstance(metric, dict) or not isinstance(metric.get("unit"), str):
            raise AttachError(source, "is not a metric result with a unit", f"{tag}.unit")
        figures = {}
        for key in AIPERF_STAT_KEYS:
            if metric.get(key) is not None:
                figures[key] = _number(source, metric, key, where=f"{tag}.")
        if not figures:
            raise AttachError(source, "has no value (avg, p50, …)", f"{tag}.avg")
        unit = metric["unit"]
        if ours.endswith("_ms") and unit not in ("ms", "sec", "us", "ns"):
            raise AttachError(source, f"unit {unit!r} is not a time unit", f"{tag}.unit")
        scale = {"ms": 1.0, "sec": 1000.0, "us": 0.001, "ns": 1e-6}.get(unit, 1.0) if ours.endswith("_ms") else 1.0
        summary[ours] = {k: v * scale for k, v in figures.items()} if ours != "requests" else int(figures.get("avg", 0))
    return summary


def parse(source: str, raw: bytes) -> tuple[str, dict]:
    """('vllm-bench'|'aiperf', summary) or AttachError naming the file and field."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise AttachError(source, "is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise AttachError(source, f"is not JSON (line {error.lineno}, column {error.colno}: {error.msg})") from None
    if not isinstance(data, dict):
        raise AttachError(source, "is not a JSON object (a vLLM bench serve result or an AIPerf export)")
    if "aiperf_version" in data or "schema_version" in data or "time_to_first_token" in data:
        return "aiperf", _aiperf_summary(source, data)
    if any(key in data for key in ("mean_ttft_ms", "completed", "max_concurrency", "num_prompts", "ttfts")):
        return "vllm-bench", _vllm_summary(source, data)
    raise AttachError(source, "unknown format: neither a vLLM bench serve result (mean_ttft_ms, completed, …) nor an "
                      "AIPerf profile_export_aiperf.json (schema_version, time_to_first_token, …)")


def _folder(pilot: Pilot) -> str:
    return f"attachments/{pilot.code}"


def attach(pilot: Pilot, path: Path | str, *, actor: str) -> dict:
    """Validate and store a customer's file for the pilot; returns its manifest. Nothing is stored on bad input."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise AttachError(str(path), f"cannot be read: {error.strerror}") from None
    fmt, summary = parse(path.name, raw)
    sha256 = sha256_bytes(raw)
    put_bytes(artifact_storage_name(sha256), raw, sha256, what=f"customer measurement {path.name}")
    manifest = {"schema": MANIFEST_SCHEMA, "label": LABEL, "source": "customer", "judged": False,
                "pilot": str(pilot.code), "file": path.name, "format": fmt, "sha256": sha256, "size": len(raw),
                "storage_name": artifact_storage_name(sha256), "attached_by": actor,
                "attached_at": datetime.now(UTC).isoformat(timespec="seconds"), "summary": summary}
    data = json.dumps(manifest, sort_keys=True, indent=1).encode()
    digest = sha256_bytes(data)
    put_bytes(f"{_folder(pilot)}/{digest}.json", data, digest, what=f"manifest of {path.name}")
    return {**manifest, "manifest_sha256": digest}


def list_attachments(pilot: Pilot) -> list[dict]:
    """The pilot's attached measurements (manifests re-hashed on read), oldest first. A manifest or file that no
    longer hashes to its name is listed with its error, never silently left out."""
    storage = evidence_storage()
    try:
        _, files = storage.listdir(_folder(pilot))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in sorted(f for f in files if f.endswith(".json") and len(f) == 69):
        digest = name[:-5]
        try:
            manifest = json.loads(get_bytes(f"{_folder(pilot)}/{name}", digest))
            get_bytes(manifest["storage_name"], manifest["sha256"])
        except (ArtifactMismatch, ValueError, KeyError) as error:
            out.append({"schema": MANIFEST_SCHEMA, "label": LABEL, "manifest_sha256": digest, "error": str(error)})
            continue
        out.append({**manifest, "manifest_sha256": digest})
    return sorted(out, key=lambda m: (m.get("attached_at") or "", m["manifest_sha256"]))


def read_attachment(manifest: dict) -> bytes:
    """The customer's file as attached, re-hashed."""
    return get_bytes(manifest["storage_name"], manifest["sha256"])
