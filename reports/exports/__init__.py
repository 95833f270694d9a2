"""A run's (or a pilot's) evidence in the formats serving teams already read (docs/results.md).

Per arm × concurrency × phase, from the run's stored records (re-hashed on read, runners.artifacts):

* AIPerf 0.13 — `profile_export_aiperf.json` (schema 1.4 of `JsonExportData`: per metric `unit`, avg/min/max/std,
  p1…p99, count, sum in AIPerf's metric tags and display units) and the per-request `profile_export.jsonl`
  (`MetricRecordInfo` lines);
* llm-d-benchmark's benchmark report v0.2 (`version: "0.2"`, `run`, `scenario.stack`, `scenario.load`,
  `results.request_performance.aggregate`);
* a flat CSV: one row per cell and metric, and one row per criterion cell of the verdict (its value and interval,
  the judge's figures unchanged).

Every file says whether its evidence is simulated or measured and names the pilot, the run, the verdict and the plan
version it belongs to. A customer's own measurement (reports.exports.attach) is listed beside the arms, labelled as his.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gates.judge.records import RecordError, load_inputs
from gates.models import Evaluation, Pilot
from reports.exports.attach import list_attachments, read_attachment
from runners.artifacts import read_artifact
from runners.models import Artifact, Job

FORMATS = ("aiperf", "llm-d", "csv")
AIPERF_VERSION = "0.13.0"            # the AIPerf release whose models the export follows
AIPERF_SCHEMA_VERSION = "1.4"        # JsonExportData.SCHEMA_VERSION in AIPerf 0.13.0
LLMD_REPORT_VERSION = "0.2"          # llm-d-benchmark benchmark_report/schema_v0_2.py
PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
RECORD_KINDS = ("records", "phase-summary")

# fxpilot metric → (AIPerf tag, AIPerf display unit)
AIPERF_TAGS = {
    "ttft_ms": ("time_to_first_token", "ms"),
    "latency_ms": ("request_latency", "ms"),
    "itl_ms": ("inter_token_latency", "ms"),
    "isl": ("input_sequence_length", "tokens"),
    "osl": ("output_sequence_length", "tokens"),
}


class ExportError(Exception):
    """The run cannot be exported; the message names the run, the file or the field."""


@dataclass
class Cell:
    arm: str
    concurrency: int
    phase: str
    repetitions: list[int]
    requests: int
    errors: int
    duration_s: float
    values: dict[str, np.ndarray]          # ttft_ms, latency_ms, itl_ms, isl, osl (ok requests only)
    rows: list[dict] = field(default_factory=list)   # per-request rows (ok and error)

    @property
    def name(self) -> str:
        return f"{self.arm}_c{self.concurrency}_{self.phase}"


@dataclass
class Context:
    """What every exported file names: whose evidence it is and what was decided on it."""

    pilot: str
    pilot_name: str
    run: str
    gate: str | None
    evidence: str                # "simulated" or "measured"
    verdict: str | None          # the run's latest evaluation, None when not judged
    plan_version: int | None
    plan_sha256: str | None
    model: str
    tensor_parallel_size: int | None
    hardware: dict
    versions: dict
    lmcache: dict

    def label(self) -> dict:
        return {"source": "fxpilot", "evidence": self.evidence, "simulated": self.evidence == "simulated",
                "pilot": self.pilot, "pilot_name": self.pilot_name, "run": self.run, "gate": self.gate,
                "verdict": self.verdict, "plan_version": self.plan_version, "plan_sha256": self.plan_sha256}


def stats(values: np.ndarray) -> dict:
    """AIPerf's statistics: mean, population std (ddof=0), min, max and linearly interpolated percentiles."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return {"count": 0}
    out = {"avg": float(values.mean()), "min": float(values.min()), "max": float(values.max()),
           "std": float(values.std(ddof=0)), "count": int(values.size), "sum": float(values.sum())}
    for q, value in zip(PERCENTILES, np.percentile(values, PERCENTILES), strict=True):
        out[f"p{q}"] = float(value)
    return out


# --------------------------------------------------------------------------- reading a run


def _artifacts(job: Job) -> list[tuple[str, bytes]]:
    items = job.artifacts.filter(kind__in=RECORD_KINDS, outcome="").order_by("name")
    return [(artifact.name, read_artifact(artifact)) for artifact in items]


def cells_of(job: Job) -> list[Cell]:
    """The run's request records grouped per arm × concurrency × phase (repetitions pooled)."""
    files = _artifacts(job)
    if not files:
        raise ExportError(f"run {job.code}: no stored records to export")
    try:
        inputs = load_inputs(files)
    except RecordError as error:
        raise ExportError(f"run {job.code}: {error}") from None
    frame = inputs.requests
    cells = []
    if frame is None or len(frame) == 0:
        return cells
    frame = frame.sort_values(["arm", "concurrency", "phase", "repetition", "t_send"], kind="stable")
    for (arm, concurrency, phase), part in frame.groupby(["arm", "concurrency", "phase"], sort=True, observed=True):
        ok = part[part["status"] == "ok"]
        first = ok["t_first_token"].to_numpy(dtype=np.float64)
        send = ok["t_send"].to_numpy(dtype=np.float64)
        end = ok["t_end"].to_numpy(dtype=np.float64)
        osl = ok["output_tokens"].to_numpy(dtype=np.int64)
        has_first = np.isfinite(first)
        multi = has_first & (osl > 1)
        duration = 0.0
        for _, rep in part.groupby("repetition", sort=True):
            duration += float(rep["t_end"].max() - rep["t_send"].min())
        values = {
            "ttft_ms": (first[has_first] - send[has_first]) * 1000.0,
            "latency_ms": (end - send) * 1000.0,
            "itl_ms": (end[multi] - first[multi]) / (osl[multi] - 1) * 1000.0,
            "isl": ok["prompt_tokens"].to_numpy(dtype=np.float64),
            "osl": osl.astype(np.float64),
        }
        rows = part[["session", "repetition", "t_send", "t_first_token", "t_end", "wall_anchor", "prompt_tokens",
                     "output_tokens", "cached_tokens", "status", "error"]].to_dict("records")
        cells.append(Cell(arm=str(arm), concurrency=int(concurrency), phase=str(phase),
                          repetitions=sorted(int(r) for r in part["repetition"].unique()), requests=int(len(ok)),
                          errors=int(len(part) - len(ok)), duration_s=duration, values=values, rows=rows))
    return cells


def _inventory(pilot: Pilot) -> dict:
    artifact = Artifact.objects.filter(job__pilot=pilot, kind="inventory", outcome="").order_by("-created").first()
    if artifact is None:
        return {}
    try:
        data = json.loads(read_artifact(artifact))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _versions(job: Job) -> dict:
    artifact = job.artifacts.filter(kind="phase-summary", outcome="").order_by("name").first()
    if artifact is None:
        return {}
    for line in read_artifact(artifact).decode("utf-8", "replace").splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("versions"), dict):
            return obj["versions"]
    return {}


def context_of(job: Job, cells: list[Cell] | None = None) -> Context:
    pilot = job.pilot
    evaluation = Evaluation.objects.filter(job=job).select_related("plan_version").order_by("-pk").first()
    simulated = job.artifacts.filter(kind__in=RECORD_KINDS, simulated=True).exists() or bool(
        evaluation and evaluation.simulated)
    plan = evaluation.plan_version if evaluation else pilot.signed_plan
    deployment = pilot.deployment or {}
    inventory = _inventory(pilot)
    gpus = inventory.get("gpus") if isinstance(inventory.get("gpus"), dict) else {}
    sizes = deployment.get("sizes") if isinstance(deployment.get("sizes"), dict) else {}
    return Context(
        pilot=str(pilot.code), pilot_name=pilot.name, run=str(job.code),
        gate=job.gate.label if job.gate_id else None, evidence="simulated" if simulated else "measured",
        verdict=evaluation.verdict if evaluation else None, plan_version=plan.number if plan else None,
        plan_sha256=plan.sha256 if plan else None, model=str(deployment.get("model") or pilot.llm_model),
        tensor_parallel_size=deployment.get("tensor_parallel_size"),
        hardware={"model": gpus.get("model") or "unknown", "count": gpus.get("count")},
        versions=_versions(job),
        lmcache={"chunk_size": sizes.get("chunk_size"), "max_local_cpu_size_gib": sizes.get("max_local_cpu_size"),
                 "max_local_disk_size_gib": sizes.get("max_local_disk_size"),
                 "use_odirect": deployment.get("use_odirect")},
    )


# --------------------------------------------------------------------------- AIPerf


def aiperf_summary(cell: Cell, ctx: Context) -> dict:
    """`profile_export_aiperf.json` of one cell: AIPerf 0.13's JsonExportData (schema 1.4) plus an `fxpilot` block
    (JsonExportData allows extra keys) saying simulated or measured, the verdict and the plan version."""
    out: dict = {"schema_version": AIPERF_SCHEMA_VERSION, "aiperf_version": AIPERF_VERSION,
                 "benchmark_id": f"{ctx.run}/{cell.name}"}
    for key, (tag, unit) in AIPERF_TAGS.items():
        figures = stats(cell.values[key])
        if figures["count"]:
            out[tag] = {"unit": unit, **figures}
    duration = cell.duration_s
    out["request_count"] = {"unit": "requests", "avg": float(cell.requests)}
    out["error_request_count"] = {"unit": "requests", "avg": float(cell.errors)}
    out["benchmark_duration"] = {"unit": "sec", "avg": duration}
    total_osl = float(cell.values["osl"].sum())
    out["total_output_tokens"] = {"unit": "tokens", "avg": total_osl}
    out["total_isl"] = {"unit": "tokens", "avg": float(cell.values["isl"].sum())}
    out["total_osl"] = {"unit": "tokens", "avg": total_osl}
    if duration > 0:
        out["request_throughput"] = {"unit": "requests/sec", "avg": cell.requests / duration}
        out["output_token_throughput"] = {"unit": "tokens/sec", "avg": total_osl / duration}
    out["was_cancelled"] = False
    out["is_complete"] = True
    out["run_info"] = {"benchmark_id": f"{ctx.run}/{cell.name}", "run_label": cell.name,
                       "variation_label": "base", "variation_values": {
                           "arm": cell.arm, "concurrency": cell.concurrency, "phase": cell.phase}}
    out["fxpilot"] = {**ctx.label(), "arm": cell.arm, "concurrency": cell.concurrency, "phase": cell.phase,
                      "repetitions": cell.repetitions,
                      "note": "repetitions pooled; benchmark_duration is the sum of each repetition's window"}
    return out


def _num(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def aiperf_records(cell: Cell, ctx: Context) -> list[dict]:
    """The per-request lines (AIPerf 0.13's MetricRecordInfo: metadata, metrics {tag: {value, unit}}, error)."""
    lines = []
    for number, row in enumerate(cell.rows):
        anchor = _num(row["wall_anchor"]) or 0.0
        send, end, first = _num(row["t_send"]), _num(row["t_end"]), _num(row["t_first_token"])
        metrics = {"request_latency": {"value": (end - send) * 1000.0, "unit": "ms"},
                   "input_sequence_length": {"value": int(row["prompt_tokens"]), "unit": "tokens"},
                   "output_sequence_length": {"value": int(row["output_tokens"]), "unit": "tokens"}}
        ok = row["status"] == "ok"
        if ok and first is not None:
            metrics["time_to_first_token"] = {"value": (first - send) * 1000.0, "unit": "ms"}
            if int(row["output_tokens"]) > 1:
                metrics["inter_token_latency"] = {
                    "value": (end - first) / (int(row["output_tokens"]) - 1) * 1000.0, "unit": "ms"}
        if not ok:
            metrics = {"error_isl": {"value": int(row["prompt_tokens"]), "unit": "tokens"}}
        lines.append({
            "metadata": {
                "session_num": number, "x_request_id": f"{cell.name}/r{int(row['repetition'])}/{row['session']}",
                "conversation_id": str(row["session"]), "request_start_ns": int(round((anchor + send) * 1e9)),
                "request_end_ns": int(round((anchor + end) * 1e9)), "worker_id": f"fxpilot-{cell.arm}",
                "record_processor_id": "fxpilot-export", "benchmark_phase": "profiling",
            },
            "metrics": metrics,
            "error": None if ok else {"type": "RequestError", "message": row["error"] if isinstance(row["error"], str)
                                      and row["error"] else "error (no message recorded)"},
            "fxpilot": {"evidence": ctx.evidence, "verdict": ctx.verdict, "plan_version": ctx.plan_version,
                        "run": ctx.run, "repetition": int(row["repetition"])},
        })
    return lines


# --------------------------------------------------------------------------- llm-d benchmark report v0.2


def _llmd_stats(values: np.ndarray, units: str, scale: float = 1.0) -> dict | None:
    values = np.asarray(values, dtype=np.float64) * scale
    if values.size == 0:
        return None
    figures = stats(values)
    out = {"units": units, "mean": figures["avg"], "stddev": figures["std"], "min": figures["min"],
           "max": figures["max"]}
    out.update({f"p{q}": figures[f"p{q}"] for q in PERCENTILES})
    return out


def _drop_none(obj):
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_drop_none(v) for v in obj]
    return obj


def llmd_report(cell: Cell, ctx: Context) -> dict:
    """One cell as an llm-d-benchmark benchmark report v0.2. The schema forbids unknown keys except in `generic`
    components: fxpilot's labels (evidence, verdict, plan version) are a `generic` component of the stack."""
    tp = ctx.tensor_parallel_size if isinstance(ctx.tensor_parallel_size, int) and ctx.tensor_parallel_size > 0 else 1
    count = ctx.hardware.get("count") if isinstance(ctx.hardware.get("count"), int) and ctx.hardware["count"] > 0 else tp
    vllm_version = str(ctx.versions.get("vllm") or "unknown")
    lmcache_version = ctx.versions.get("lmcache") or (ctx.versions.get("lmcache_fingerprint") or {}).get("version")
    engine_cfg = f"{ctx.run}/{cell.arm}"
    stack = [
        {"metadata": {"kind": "inference_engine", "label": f"vllm-{cell.arm}", "cfg_id": engine_cfg,
                      "description": f"vLLM, arm {cell.arm} ({ctx.evidence})"},
         "standardized": {"tool": "vllm", "tool_version": vllm_version, "role": "replica",
                          "model": {"name": ctx.model},
                          "accelerator": {"model": str(ctx.hardware.get("model") or "unknown"), "count": count,
                                          "parallelism": {"tp": tp}}},
         "native": {"config": {"arm": cell.arm}}},
        {"metadata": {"kind": "generic", "label": f"fxpilot-{cell.arm}", "cfg_id": ctx.run,
                      "description": f"fxpilot {ctx.evidence} evidence; verdict {ctx.verdict or 'not judged'}, "
                                    f"plan version {ctx.plan_version}"},
         # null values are dropped from the report (as llm-d's own dump does): say "not judged" and "none" instead
         "standardized": {"tool": "fxpilot", "tool_version": "1", **ctx.label(),
                          "verdict": ctx.verdict or "not judged",
                          "plan_version": ctx.plan_version if ctx.plan_version is not None else "none"},
         "native": {}},
    ]
    if cell.arm != "recompute":
        stack.append({"metadata": {"kind": "generic", "label": f"lmcache-{cell.arm}", "cfg_id": engine_cfg,
                                   "description": "LMCache configuration of the arm"},
                      "standardized": {"tool": "lmcache", "tool_version": str(lmcache_version or "unknown"),
                                       "arm": cell.arm, **ctx.lmcache,
                                       "fingerprint": ctx.versions.get("lmcache_fingerprint")},
                      "native": {}})
    isl = cell.values["isl"]
    osl = cell.values["osl"]
    load_std = {"tool": "fxpilot-workload", "tool_version": "1", "source": "random",
                "input_seq_len": {"distribution": "other", "value": float(isl.mean()) if isl.size else 1.0,
                                  "min": int(isl.min()) if isl.size else None, "max": int(isl.max()) if isl.size else None},
                "concurrency": cell.concurrency}
    if osl.size:
        load_std["output_seq_len"] = {"distribution": "other", "value": max(1.0, float(osl.mean())),
                                      "min": int(osl.min()), "max": max(1, int(osl.max()))}
    duration = cell.duration_s
    aggregate = {
        "requests": {"total": cell.requests + cell.errors, "failures": cell.errors,
                     "input_length": _llmd_stats(isl, "count"), "output_length": _llmd_stats(osl, "count")},
        "latency": {"time_to_first_token": _llmd_stats(cell.values["ttft_ms"], "ms"),
                    "inter_token_latency": _llmd_stats(cell.values["itl_ms"], "ms/token"),
                    "request_latency": _llmd_stats(cell.values["latency_ms"], "ms")},
    }
    if duration > 0:
        aggregate["throughput"] = {
            "output_token_rate": {"units": "tokens/s", "mean": float(osl.sum()) / duration},
            "input_token_rate": {"units": "tokens/s", "mean": float(isl.sum()) / duration},
            "total_token_rate": {"units": "tokens/s", "mean": float(isl.sum() + osl.sum()) / duration},
            "requests_rate": {"units": "queries/s", "mean": cell.requests / duration},
        }
    report = {
        "version": LLMD_REPORT_VERSION,
        "run": {"uid": f"{ctx.run}/{cell.name}", "eid": ctx.run, "cid": ctx.pilot},
        "scenario": {"stack": stack,
                     "load": {"metadata": {"description": f"fxpilot {cell.phase} phase, arm {cell.arm}, "
                                                          f"concurrency {cell.concurrency}, repetitions "
                                                          f"{cell.repetitions}"},
                              "standardized": load_std, "native": {}}},
        "results": {"request_performance": {"aggregate": aggregate}},
    }
    return _drop_none(report)


# --------------------------------------------------------------------------- CSV

CSV_COLUMNS = ["source", "evidence", "pilot", "run", "gate", "verdict", "plan_version", "arm", "concurrency", "phase",
               "metric", "unit", "count", "avg", "min", "max", "std", *[f"p{q}" for q in PERCENTILES],
               "value", "ci_low", "ci_high", "cell_verdict"]


def csv_rows(cells: list[Cell], ctx: Context, evaluation: Evaluation | None) -> list[dict]:
    base = {"source": "fxpilot", "evidence": ctx.evidence, "pilot": ctx.pilot, "run": ctx.run, "gate": ctx.gate,
            "verdict": ctx.verdict, "plan_version": ctx.plan_version}
    rows = []
    for cell in cells:
        where = {"arm": cell.arm, "concurrency": cell.concurrency, "phase": cell.phase}
        for key, (tag, unit) in AIPERF_TAGS.items():
            figures = stats(cell.values[key])
            if figures["count"]:
                rows.append({**base, **where, "metric": tag, "unit": unit,
                             **{k: figures[k] for k in ("count", "avg", "min", "max", "std")},
                             **{f"p{q}": figures[f"p{q}"] for q in PERCENTILES}})
        rows.append({**base, **where, "metric": "error_request_count", "unit": "requests", "value": cell.errors})
    if evaluation is not None:
        # the verdict's own figures, unchanged: one row per criterion cell
        for criterion in evaluation.result.get("criteria") or []:
            for part in criterion.get("cells") or [criterion]:
                ci = part.get("ci") or [None, None]
                rows.append({**base, "arm": criterion.get("candidate"), "concurrency": part.get("concurrency"),
                             "phase": criterion.get("phase"), "metric": f"criterion:{criterion.get('key')}",
                             "unit": criterion.get("unit"), "value": part.get("value"), "ci_low": ci[0],
                             "ci_high": ci[1], "cell_verdict": part.get("verdict")})
    return rows


def write_csv(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buffer.getvalue()


# --------------------------------------------------------------------------- whole exports


def jobs_of(pilot: Pilot) -> list[Job]:
    """The pilot's gate runs that stored records, oldest first."""
    return list(Job.objects.filter(pilot=pilot, kind=Job.Kind.GATE_RUN,
                                   artifacts__kind__in=RECORD_KINDS).distinct().order_by("created"))


def export_run(job: Job, fmt: str, out: Path) -> list[Path]:
    """Write one run's files under out/; returns the paths written."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    cells = cells_of(job)
    ctx = context_of(job, cells)
    evaluation = Evaluation.objects.filter(job=job).order_by("-pk").first()
    label = f"{ctx.gate or 'run'}-{str(job.code)[:8]}"
    written: list[Path] = []
    if fmt == "csv":
        path = out / f"{label}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(write_csv(csv_rows(cells, ctx, evaluation)), encoding="utf-8")
        return [path]
    for cell in cells:
        folder = out / label / cell.name
        folder.mkdir(parents=True, exist_ok=True)
        if fmt == "aiperf":
            summary = folder / "profile_export_aiperf.json"
            summary.write_text(json.dumps(aiperf_summary(cell, ctx), indent=2), encoding="utf-8")
            lines = folder / "profile_export.jsonl"
            lines.write_text("".join(json.dumps(line) + "\n" for line in aiperf_records(cell, ctx)), encoding="utf-8")
            written += [summary, lines]
        else:
            report = folder / "benchmark_report_v0.2.json"
            report.write_text(json.dumps(llmd_report(cell, ctx), indent=2), encoding="utf-8")
            written.append(report)
    return written


def export(target: Pilot | Job, fmt: str, out: Path) -> list[Path]:
    """A run's or a whole pilot's export, with the customer's own measurements listed beside the arms."""
    out = Path(out)
    jobs = [target] if isinstance(target, Job) else jobs_of(target)
    pilot = target.pilot if isinstance(target, Job) else target
    written: list[Path] = []
    for job in jobs:
        written += export_run(job, fmt, out)
    attached = list_attachments(pilot)
    if attached:
        out.mkdir(parents=True, exist_ok=True)
        path = out / "customer_measurements.json"
        path.write_text(json.dumps({"customer_measurements": attached}, indent=2), encoding="utf-8")
        written.append(path)
        if fmt == "csv":
            path = out / "customer_measurements.csv"
            path.write_text(write_csv(customer_rows(attached)), encoding="utf-8")
            written.append(path)
        else:
            for manifest in attached:
                if manifest.get("error"):
                    continue
                path = out / "customer" / f"{manifest['sha256'][:12]}-{Path(manifest['file']).name}"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(read_attachment(manifest))
                written.append(path)
    return written


def customer_rows(attached: list[dict]) -> list[dict]:
    """The customer's own figures, in the CSV's columns, labelled as his (never fxpilot evidence)."""
    rows = []
    for manifest in attached:
        base = {"source": manifest.get("label"), "evidence": "customer", "pilot": manifest.get("pilot"),
                "run": manifest.get("file"), "arm": "customer"}
        summary = manifest.get("summary") or {}
        for key, tag in (("ttft_ms", "time_to_first_token"), ("itl_ms", "inter_token_latency"),
                         ("latency_ms", "request_latency")):
            figures = summary.get(key)
            if isinstance(figures, dict):
                rows.append({**base, "metric": tag, "unit": "ms", **figures})
    return rows


def run_results(job: Job) -> dict:
    """The API's answer: per cell the AIPerf summary and the llm-d report, the CSV rows, the customer's files."""
    cells = cells_of(job)
    ctx = context_of(job, cells)
    evaluation = Evaluation.objects.filter(job=job).order_by("-pk").first()
    return {
        "fxpilot": ctx.label(),
        "cells": [{"arm": c.arm, "concurrency": c.concurrency, "phase": c.phase, "repetitions": c.repetitions,
                   "aiperf": aiperf_summary(c, ctx), "llm_d": llmd_report(c, ctx)} for c in cells],
        "csv": csv_rows(cells, ctx, evaluation),
        "customer_measurements": list_attachments(job.pilot),
    }
