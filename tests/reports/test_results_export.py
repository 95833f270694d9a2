"""`results export`: a run with known records gives known percentiles in AIPerf's, llm-d's and a flat CSV form, and
the files are accepted by the peers' published models (copies of their fields, versions named below).

AIPerf 0.13.0 itself is not installed in the test environment: its wheel pins pandas~=2.3.3, pillow~=12.3.0,
rich~=14.1.0 and jmespath~=1.0.1 (fxpilot pins pandas 3.1.1, pillow 13.0.0, rich 15.0.0, jmespath 1.1.0) and pulls
transformers, datasets, pyarrow, kubernetes-asyncio, dash and matplotlib. The models below copy the fields of
`aiperf/common/models/export_models.py` (JsonMetricResult, JsonExportData, SCHEMA_VERSION "1.4") and
`aiperf/common/models/record_models.py` (MetricValue, MetricRecordMetadata, MetricRecordInfo) of aiperf==0.13.0, and
of llm-d-benchmark's `benchmark_report/schema_v0_2.py` + `schema_v0_2_components.py` + `base.py` (report v0.2).
The real aiperf==0.13.0 package, installed in a separate scratch virtual environment (1.2 GB) on 2026-12-05, loaded
this file's exports with its own `JsonExportData` and `MetricRecordInfo` without an error (docs/results.md).
"""
from __future__ import annotations

import csv
import io
import json
import math
import uuid
from enum import StrEnum
from typing import Annotated, Any, Literal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from pydantic import BaseModel, ConfigDict, Discriminator, Field, ValidationError, model_validator

from gates.models import Organisation, Pilot
from reports import exports
from runners.artifacts import store_bytes
from runners.models import Job

# --------------------------------------------------------------------------- AIPerf 0.13.0 models (copied fields)


class AIPerfBase(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="allow")


class JsonMetricResult(AIPerfBase):
    unit: str
    avg: float | None = None
    p1: float | None = None
    p5: float | None = None
    p10: float | None = None
    p25: float | None = None
    p50: float | None = None
    p75: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    min: int | float | None = None
    max: int | float | None = None
    std: float | None = None
    count: int | None = None
    sum: int | float | None = None


class RunInfo(AIPerfBase):
    benchmark_id: str | None = None
    sweep_id: str | None = None
    random_seed: int | None = Field(default=None, ge=0)
    trial: int | None = Field(default=None, ge=0)
    run_label: str | None = None
    variation_label: str | None = None
    variation_index: int | None = Field(default=None, ge=0)
    variation_values: dict[str, Any] | None = None
    cli_command: str | None = None


class JsonExportData(AIPerfBase):
    model_config = ConfigDict(extra="allow")
    schema_version: str | None = None
    aiperf_version: str | None = None
    benchmark_id: str | None = None
    request_throughput: JsonMetricResult | None = None
    request_latency: JsonMetricResult | None = None
    request_count: JsonMetricResult | None = None
    time_to_first_token: JsonMetricResult | None = None
    inter_token_latency: JsonMetricResult | None = None
    output_token_throughput: JsonMetricResult | None = None
    output_sequence_length: JsonMetricResult | None = None
    input_sequence_length: JsonMetricResult | None = None
    total_output_tokens: JsonMetricResult | None = None
    benchmark_duration: JsonMetricResult | None = None
    total_isl: JsonMetricResult | None = None
    total_osl: JsonMetricResult | None = None
    error_request_count: JsonMetricResult | None = None
    run_info: RunInfo | None = None
    was_cancelled: bool | None = None
    is_complete: bool | None = None


class MetricValue(AIPerfBase):
    value: int | float | list[int] | list[float]
    unit: str


class CreditPhase(StrEnum):
    WARMUP = "warmup"
    PROFILING = "profiling"


class MetricRecordMetadata(AIPerfBase):
    session_num: int
    x_request_id: str | None = None
    x_correlation_id: str | None = None
    conversation_id: str | None = None
    turn_index: int | None = None
    request_start_ns: int
    request_ack_ns: int | None = None
    request_end_ns: int
    worker_id: str
    record_processor_id: str
    benchmark_phase: CreditPhase
    was_cancelled: bool = False


class ErrorDetails(AIPerfBase):
    code: int | None = None
    type: str | None = None
    message: str


class MetricRecordInfo(AIPerfBase):
    metadata: MetricRecordMetadata
    metrics: dict[str, MetricValue]
    error: ErrorDetails | None = None


# --------------------------------------------------------------------------- llm-d benchmark report v0.2 (copied fields)

FORBID = ConfigDict(extra="forbid")
UNITS_QUANTITY, UNITS_TIME, UNITS_GEN_LATENCY = {"count"}, {"ms", "s"}, {"ms/token", "s/token"}
UNITS_GEN_THROUGHPUT, UNITS_REQUEST_THROUGHPUT = {"tokens/s"}, {"queries/s"}
UNITS = {"count", "percent", "fraction", "ms", "s", "MB", "GB", "TB", "MiB", "GiB", "TiB", "Mbit/s", "Gbit/s",
         "Tbit/s", "GiB/s", "MB/s", "GB/s", "TB/s", "ms/token", "s/token", "tokens/s", "queries/s", "Watts"}


class ComponentMetadata(BaseModel):
    model_config = FORBID
    kind: str
    schema_version: str = "0.0.1"
    label: str
    cfg_id: str
    description: str | None = None


class ComponentNative(BaseModel):
    model_config = FORBID
    args: dict[str, Any] | None = None
    envars: dict[str, Any] | None = None
    config: Any | None = None


class Generic(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: Literal["generic"]
    tool: str
    tool_version: str


class Parallelism(BaseModel):
    model_config = FORBID
    dp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)


class Accelerator(BaseModel):
    model_config = FORBID
    model: str
    count: int = Field(..., ge=1)
    parallelism: Parallelism


class EngineModel(BaseModel):
    model_config = FORBID
    name: str


class InferenceEngine(BaseModel):
    model_config = FORBID
    kind: Literal["inference_engine"]
    tool: str
    tool_version: str
    role: Literal["replica", "prefill", "decode"]
    model: EngineModel
    accelerator: Accelerator


class Component(BaseModel):
    model_config = FORBID
    metadata: ComponentMetadata
    standardized: Annotated[Generic | InferenceEngine, Discriminator("kind")]
    native: ComponentNative

    @model_validator(mode="before")
    @classmethod
    def inject_kind(cls, data):
        if "standardized" in data and "kind" in data["standardized"]:
            raise ValueError('Do not populate "kind" field of "standardized"')
        data = {**data, "standardized": {**data["standardized"], "kind": data["metadata"].get("kind")}}
        return data


class SequenceLength(BaseModel):
    model_config = FORBID
    distribution: Literal["fixed", "gaussian", "random", "other"]
    value: int | float = Field(..., ge=1)
    std_dev: float | None = Field(None, ge=0)
    min: int | None = Field(None, ge=0)
    max: int | None = Field(None, ge=1)


class LoadStandardized(BaseModel):
    model_config = FORBID
    tool: str
    tool_version: str
    source: Literal["random", "sampled"]
    stage: int = Field(0, ge=0)
    input_seq_len: SequenceLength
    output_seq_len: SequenceLength | None = None
    rate_qps: float | None = Field(None, gt=0)
    concurrency: int | float | None = Field(None, ge=1)


class LoadMetadata(BaseModel):
    model_config = FORBID
    schema_version: str = "0.0.1"
    cfg_id: str | None = None
    description: str | None = None


class Load(BaseModel):
    model_config = FORBID
    metadata: LoadMetadata
    standardized: LoadStandardized
    native: ComponentNative


class Statistics(BaseModel):
    units: str
    mean: float
    mode: float | int | None = None
    stddev: float | None = Field(None, ge=0)
    min: float | int | None = None
    p0p1: float | int | None = None
    p1: float | int | None = None
    p5: float | int | None = None
    p10: float | int | None = None
    p25: float | int | None = None
    p50: float | int | None = None
    p75: float | int | None = None
    p90: float | int | None = None
    p95: float | int | None = None
    p99: float | int | None = None
    p99p9: float | int | None = None
    max: float | int | None = None

    @model_validator(mode="after")
    def known_units(self):
        if self.units not in UNITS:
            raise ValueError(f"unknown units {self.units!r}")
        return self


def _units(stat: Statistics | None, allowed: set[str]) -> None:
    if stat is not None and stat.units not in allowed:
        raise ValueError(f"units {stat.units!r} not in {sorted(allowed)}")


class AggregateRequests(BaseModel):
    model_config = FORBID
    total: int = Field(..., ge=0)
    failures: int | None = Field(None, ge=0)
    incomplete: int | None = Field(None, ge=0)
    input_length: Statistics | None = None
    output_length: Statistics | None = None

    @model_validator(mode="after")
    def check_units(self):
        _units(self.input_length, UNITS_QUANTITY)
        _units(self.output_length, UNITS_QUANTITY)
        return self


class AggregateLatency(BaseModel):
    model_config = FORBID
    time_to_first_token: Statistics | None = None
    normalized_time_per_output_token: Statistics | None = None
    time_per_output_token: Statistics | None = None
    inter_token_latency: Statistics | None = None
    request_latency: Statistics | None = None

    @model_validator(mode="after")
    def check_units(self):
        _units(self.time_to_first_token, UNITS_TIME)
        _units(self.request_latency, UNITS_TIME)
        for stat in (self.normalized_time_per_output_token, self.time_per_output_token, self.inter_token_latency):
            _units(stat, UNITS_GEN_LATENCY)
        return self


class AggregateThroughput(BaseModel):
    model_config = FORBID
    input_token_rate: Statistics | None = None
    output_token_rate: Statistics | None = None
    total_token_rate: Statistics | None = None
    requests_rate: Statistics | None = None

    @model_validator(mode="after")
    def check_units(self):
        for stat in (self.input_token_rate, self.output_token_rate, self.total_token_rate):
            _units(stat, UNITS_GEN_THROUGHPUT)
        _units(self.requests_rate, UNITS_REQUEST_THROUGHPUT)
        return self


class AggregateRequestPerformance(BaseModel):
    model_config = FORBID
    requests: AggregateRequests | None = None
    latency: AggregateLatency | None = None
    throughput: AggregateThroughput | None = None


class RequestPerformance(BaseModel):
    model_config = FORBID
    aggregate: AggregateRequestPerformance | None = None
    time_series: dict | None = None


class Results(BaseModel):
    model_config = FORBID
    request_performance: RequestPerformance | None = None
    observability: dict | None = None
    profiling: Any | None = None


class Run(BaseModel):
    model_config = FORBID
    uid: str | None = None
    eid: str | None = None
    cid: str | None = None
    time: dict | None = None
    user: str | None = None


class Scenario(BaseModel):
    model_config = FORBID
    stack: list[Component] | None = None
    load: Load | None = None


class BenchmarkReportV02(BaseModel):
    model_config = FORBID
    version: str = "0.2"
    run: Run
    scenario: Scenario | None = None
    results: Results


# --------------------------------------------------------------------------- a run with known records

TTFT_S = [0.1, 0.2, 0.3, 0.4, 0.5]   # → TTFT ms 100…500: avg 300, p50 300, p90 460, p99 496, std √20000


def _request(i: int, ttft: float | None, *, status: str = "ok", arm: str = "fx", output_tokens: int = 11) -> dict:
    t_send = 10.0 + i
    return {"schema": "fxpilot.request/1", "run_id": "r1", "arm": arm, "instance": "n1", "phase": "measure",
            "concurrency": 2, "repetition": 1, "session": f"s{i}", "prompt_tokens": 1000 + i, "cached_tokens": 0,
            "output_tokens": output_tokens, "t_send": t_send,
            "t_first_token": None if ttft is None else t_send + ttft,
            "t_end": t_send + (ttft or 0.0) + 1.0, "wall_anchor": 1_800_000_000.0, "status": status,
            "error": None if status == "ok" else "HTTP 500", "simulated": True}


@pytest.fixture
def run(db):
    suffix = uuid.uuid4().hex[:6]
    vendor = Organisation.objects.create(name=f"Vendor {suffix}", kind=Organisation.Kind.VENDOR)
    customer = Organisation.objects.create(name=f"Customer {suffix}", kind=Organisation.Kind.CUSTOMER)
    pilot = Pilot.objects.create(name=f"Pilot {suffix}", vendor=vendor, customer=customer,
                                 deployment={"model": "tiny/model", "tensor_parallel_size": 2,
                                             "sizes": {"chunk_size": 256, "max_local_cpu_size": 1.0}})
    job = Job.objects.create(pilot=pilot)
    lines = [_request(i, t) for i, t in enumerate(TTFT_S)] + [_request(9, None, status="error")]
    lines += [_request(20 + i, t * 2, arm="recompute") for i, t in enumerate(TTFT_S)]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    store_bytes(job, "node1/records.jsonl", data, kind="records", simulated=True)
    return job


def test_known_records_give_known_percentiles_in_aiperf_names_and_units(run, tmp_path):
    written = exports.export(run, "aiperf", tmp_path)
    folder = next(p.parent for p in written if p.parent.name == "fx_c2_measure")
    summary = json.loads((folder / "profile_export_aiperf.json").read_text())
    data = JsonExportData.model_validate(summary)
    ttft = data.time_to_first_token
    assert ttft.unit == "ms" and ttft.count == 5
    assert (ttft.avg, ttft.min, ttft.max, ttft.p50) == pytest.approx((300, 100, 500, 300))
    assert (ttft.p1, ttft.p25, ttft.p75, ttft.p90, ttft.p99) == pytest.approx((104, 200, 400, 460, 496))
    assert ttft.std == pytest.approx(math.sqrt(20000))
    assert data.request_latency.unit == "ms" and data.request_latency.avg == pytest.approx(1300)
    # ITL = (latency − TTFT) / (output tokens − 1): 1 s over 10 gaps
    assert data.inter_token_latency.avg == pytest.approx(100) and data.inter_token_latency.unit == "ms"
    assert data.input_sequence_length.unit == "tokens" and data.input_sequence_length.avg == pytest.approx(1002)
    assert data.request_count.avg == 5 and data.error_request_count.avg == 1
    # one repetition's window: first send 10.0 → last end 19 + 1 = 20.0 (the error row is in the window)
    assert data.benchmark_duration.unit == "sec" and data.benchmark_duration.avg == pytest.approx(10.0)
    assert data.request_throughput.unit == "requests/sec" and data.request_throughput.avg == pytest.approx(0.5)
    assert data.schema_version == "1.4" and data.aiperf_version == "0.13.0"
    label = summary["fxpilot"]
    assert label["evidence"] == "simulated" and label["simulated"] is True
    assert label["verdict"] is None and label["plan_version"] is None and label["run"] == str(run.code)

    lines = (folder / "profile_export.jsonl").read_text().splitlines()
    records = [MetricRecordInfo.model_validate_json(line) for line in lines]
    assert len(records) == 6
    ok = [r for r in records if r.error is None]
    assert sorted(r.metrics["time_to_first_token"].value for r in ok) == pytest.approx([100, 200, 300, 400, 500])
    assert [r for r in records if r.error is not None][0].error.message == "HTTP 500"
    assert all(json.loads(line)["fxpilot"]["evidence"] == "simulated" for line in lines)
    assert records[0].metadata.request_start_ns == round((1_800_000_000.0 + 10.0) * 1e9)

    other = json.loads((tmp_path / next(p for p in written if p.parent.name == "recompute_c2_measure"))
                       .read_text())
    assert other["time_to_first_token"]["p50"] == pytest.approx(600)


def test_llmd_report_validates_against_the_v02_schema_with_scenario_and_results(run, tmp_path):
    written = exports.export(run, "llm-d", tmp_path)
    path = next(p for p in written if p.parent.name == "fx_c2_measure")
    raw = json.loads(path.read_text())
    report = BenchmarkReportV02.model_validate(raw)
    assert report.version == "0.2"
    engine = next(c for c in report.scenario.stack if c.metadata.kind == "inference_engine").standardized
    assert engine.model.name == "tiny/model" and engine.accelerator.parallelism.tp == 2
    fxpilot = next(c for c in report.scenario.stack if c.metadata.label == "fxpilot-fx").standardized
    assert fxpilot.model_extra["evidence"] == "simulated" and "plan_version" in fxpilot.model_extra
    lmcache = next(c for c in report.scenario.stack if c.metadata.label == "lmcache-fx").standardized
    assert lmcache.model_extra["chunk_size"] == 256
    latency = report.results.request_performance.aggregate.latency
    assert latency.time_to_first_token.units == "ms"
    assert (latency.time_to_first_token.mean, latency.time_to_first_token.p90) == pytest.approx((300, 460))
    assert latency.inter_token_latency.units == "ms/token"
    assert report.results.request_performance.aggregate.requests.failures == 1
    assert report.scenario.load.standardized.concurrency == 2
    # the schema refuses keys it does not know: the copy is as strict as the published one
    with pytest.raises(ValidationError):
        BenchmarkReportV02.model_validate({**raw, "simulated": True})


def test_csv_rows_per_cell_and_metric(run, tmp_path):
    written = exports.export(run, "csv", tmp_path)
    rows = list(csv.DictReader(io.StringIO(written[0].read_text())))
    ttft = next(r for r in rows if r["arm"] == "fx" and r["metric"] == "time_to_first_token")
    assert (float(ttft["p50"]), float(ttft["p99"])) == pytest.approx((300.0, 496.0))
    assert (ttft["unit"], ttft["evidence"], ttft["concurrency"], ttft["phase"]) == ("ms", "simulated", "2", "measure")
    assert all(r["source"] == "fxpilot" and r["run"] == str(run.code) for r in rows)


def test_the_command_exports_and_names_an_unknown_target(run, tmp_path, capsys):
    call_command("results", "export", str(run.code), "--format", "aiperf", "--out", str(tmp_path))
    assert "profile_export_aiperf.json" in capsys.readouterr().out
    with pytest.raises(CommandError, match="no run has that code"):
        call_command("results", "export", "ffffffff-0000", "--format", "csv", "--out", str(tmp_path))


def test_a_pilot_exports_every_run_with_records(run, tmp_path, capsys):
    Job.objects.create(pilot=run.pilot)   # a run that stored nothing is left out, not an error
    call_command("results", "export", run.pilot.name, "--format", "csv", "--out", str(tmp_path))
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / f"run-{str(run.code)[:8]}.csv")]
    rows = list(csv.DictReader(io.StringIO((tmp_path / printed[0]).read_text())))
    assert {(r["arm"], r["metric"]) for r in rows} >= {("fx", "time_to_first_token"), ("recompute", "request_latency")}
