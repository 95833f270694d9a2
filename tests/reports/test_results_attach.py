"""`results attach`: a customer's own vLLM bench serve JSON or AIPerf export, validated, stored in the evidence store
with a manifest (re-hashed on read), listed beside the pilot's arms as his, never as fxpilot evidence."""
from __future__ import annotations

import json
import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from gates.models import Organisation, Pilot
from reports.exports import attach as attaching
from reports.exports import export
from runners.artifacts import evidence_storage

# a `vllm bench serve --save-result` summary as vLLM writes it (keys of its result JSON), small and made up here
VLLM_BENCH = {"date": "20261201-101010", "backend": "vllm", "model_id": "tiny/model", "num_prompts": 4,
              "max_concurrency": 2, "duration": 8.0, "completed": 4, "total_input_tokens": 4000,
              "total_output_tokens": 400, "request_throughput": 0.5, "output_throughput": 50.0,
              "mean_ttft_ms": 850.0, "median_ttft_ms": 800.0, "std_ttft_ms": 100.0, "p99_ttft_ms": 1190.0,
              "mean_itl_ms": 20.0, "median_itl_ms": 19.0, "p99_itl_ms": 40.0}
AIPERF = {"schema_version": "1.4", "aiperf_version": "0.13.0",
          "time_to_first_token": {"unit": "ms", "avg": 700.0, "p50": 650.0, "p99": 1500.0, "count": 10},
          "request_throughput": {"unit": "requests/sec", "avg": 3.0}}


@pytest.fixture
def pilot(db):
    suffix = uuid.uuid4().hex[:6]
    vendor = Organisation.objects.create(name=f"Vendor {suffix}", kind=Organisation.Kind.VENDOR)
    customer = Organisation.objects.create(name=f"Customer {suffix}", kind=Organisation.Kind.CUSTOMER)
    return Pilot.objects.create(name=f"Pilot {suffix}", vendor=vendor, customer=customer)


def _file(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_a_vllm_bench_result_and_an_aiperf_export_are_stored_and_listed_as_the_customers(pilot, tmp_path, capsys):
    call_command("results", "attach", pilot.name, _file(tmp_path, "bench.json", VLLM_BENCH), "--as", "carol")
    assert "not fxpilot evidence" in capsys.readouterr().out
    attaching.attach(pilot, _file(tmp_path, "profile_export_aiperf.json", AIPERF), actor="carol")
    listed = attaching.list_attachments(pilot)
    assert [m["format"] for m in sorted(listed, key=lambda m: m["file"])] == ["vllm-bench", "aiperf"]
    bench = next(m for m in listed if m["format"] == "vllm-bench")
    assert bench["label"] == "customer's own measurement, not fxpilot evidence" and bench["judged"] is False
    assert bench["summary"]["ttft_ms"] == {"avg": 850.0, "p50": 800.0, "p99": 1190.0}
    assert bench["summary"]["itl_ms"] == {"avg": 20.0, "p50": 19.0, "p99": 40.0}
    assert bench["attached_by"] == "carol"
    assert json.loads(attaching.read_attachment(bench)) == VLLM_BENCH   # nothing lost: the file as given

    out = tmp_path / "out"
    written = export(pilot, "csv", out)
    listing = json.loads((out / "customer_measurements.json").read_text())["customer_measurements"]
    assert len(listing) == 2 and out / "customer_measurements.csv" in written
    assert "customer's own measurement" in (out / "customer_measurements.csv").read_text()


@pytest.mark.parametrize(("name", "data", "field"), [
    ("bench.json", {k: v for k, v in VLLM_BENCH.items() if k != "mean_ttft_ms"}, "mean_ttft_ms"),
    ("bench.json", {**VLLM_BENCH, "p99_ttft_ms": "fast"}, "p99_ttft_ms"),
    ("bench.json", {**VLLM_BENCH, "ttfts": [1.0], "input_lens": [1, 2], "output_lens": [1], "errors": [""]},
     "input_lens"),
    ("aiperf.json", {**AIPERF, "schema_version": "2.0"}, "schema_version"),
    ("aiperf.json", {**AIPERF, "time_to_first_token": {"avg": 1.0}}, "time_to_first_token.unit"),
    ("aiperf.json", {k: v for k, v in AIPERF.items() if k != "time_to_first_token"}, "time_to_first_token"),
])
def test_bad_input_names_the_file_and_field_and_stores_nothing(pilot, tmp_path, name, data, field):
    with pytest.raises(CommandError) as refused:
        call_command("results", "attach", str(pilot.code), _file(tmp_path, name, data))
    assert name in str(refused.value) and repr(field) in str(refused.value)
    assert attaching.list_attachments(pilot) == []


def test_an_unknown_format_says_what_is_read(pilot, tmp_path):
    with pytest.raises(attaching.AttachError, match="unknown format.*vLLM bench serve.*AIPerf"):
        attaching.attach(pilot, _file(tmp_path, "other.json", {"hello": 1}), actor="x")
    with pytest.raises(attaching.AttachError, match="not JSON"):
        attaching.attach(pilot, _file(tmp_path, "broken.json", "{"), actor="x")


def test_an_altered_manifest_is_listed_with_its_error_never_trusted(pilot, tmp_path):
    manifest = attaching.attach(pilot, _file(tmp_path, "bench.json", VLLM_BENCH), actor="x")
    name = f"attachments/{pilot.code}/{manifest['manifest_sha256']}.json"
    storage = evidence_storage()
    path = storage.path(name)
    with open(path, "r+b") as handle:
        handle.write(b" ")
    listed = attaching.list_attachments(pilot)
    assert len(listed) == 1 and "no longer hashes" in listed[0]["error"]
