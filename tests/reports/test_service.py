"""Reports made from the database: a G3 report from the real judge, countersigning, the procurement report."""
from __future__ import annotations

import re
import stat
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.utils import translation

from gates.judge import synthetic, verdicts
from gates.models import AuditEvent, Evaluation, Report
from gates.plan import load_plan
from reports import service
from reports.context import interpolate, procurement_report_context
from reports.findings import english, in_language
from runners.artifacts import store_bytes
from runners.models import Job
from runners.runs import sample_trace
from tests.reports.countersign_helpers import countersign, keep_countersigned_upload, use_customer_side

CUSTOMER_TRACE = b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\n" + b"".join(
    f"s{i},1,{20000 + 1000 * i},100,{i}.0\ns{i},2,{20500 + 1000 * i},200,{i + 30}.0\n".encode() for i in range(10))


def _evaluate(pilot, number: int, *, trace: bytes | None = CUSTOMER_TRACE) -> Evaluation:
    """Judge synthetic Table-1 inputs with the real judge, storing them as the job's artifacts (G4: with a trace)."""
    files = synthetic.gate_inputs(number)
    gate = pilot.gate(number)
    job = Job.objects.create(pilot=pilot, gate=gate)
    for name, data in files:
        store_bytes(job, name, data, kind="records" if name.endswith(".jsonl") else "probe", simulated=True)
    if number == 4:
        store_bytes(job, "customer-trace.csv" if trace else "sample-trace.csv", trace or sample_trace(), kind="trace")
    result = verdicts.evaluate(load_plan(), number, files)
    return Evaluation.objects.create(gate=gate, job=job, plan_version=pilot.signed_plan, verdict=result["verdict"],
                                     result=result, inputs=result["inputs"], simulated=result["simulated"])


@pytest.fixture(autouse=True)
def _customer_side(tmp_path, monkeypatch):
    """The approver's own machine for the demo's customer side (reports.customer_sign_demo), outside the data folder."""
    use_customer_side(monkeypatch, tmp_path)


@pytest.fixture
def g3(signed_pilot):
    return _evaluate(signed_pilot.pilot, 3)


def test_a_gate_report_is_stored_read_only_and_verifies(signed_pilot, g3):
    report = service.create_gate_report(g3.gate, g3, language="en", who=signed_pilot.alice)
    path = service.report_path(report)
    assert path.is_file() and not path.stat().st_mode & stat.S_IWUSR
    assert report.kind == Report.Kind.GATE and report.simulated and report.signatures == 1
    result = service.verify_report_bytes(path.read_bytes())
    assert result.ok, result.reasons
    assert result.report["pilot_code"] == str(signed_pilot.pilot.code) and result.report["gate"] == 3
    assert {a.name for a in result.attachments} == {"verdict.json", "records.jsonl", "records.summary.json",
                                                    "node1/inventory.json", "node2/inventory.json"}
    assert AuditEvent.objects.filter(action="report.created", object_id=str(report.pk)).exists()
    done = subprocess.run([sys.executable, "manage.py", "verify_report", str(path)], cwd=settings.BASE_DIR,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_customer_approver_countersigns_into_a_new_file(signed_pilot, g3):
    report = service.create_gate_report(g3.gate, g3, language="en")
    original = service.report_path(report).read_bytes()
    second = countersign(report, signed_pilot.bob)
    assert second.pk != report.pk and second.signatures == 2 and second.path != report.path
    assert service.report_path(report).read_bytes() == original
    assert service.report_path(second).read_bytes().startswith(original)  # the very bytes read, signed once more
    result = service.verify_report_bytes(service.report_path(second).read_bytes())
    assert result.ok, result.reasons
    assert [s.signer.split("Common Name: ")[-1] for s in result.signatures][1] == "Bob Wang"
    assert [s.party for s in result.signatures] == ["vendor", "customer"]


def test_nobody_but_a_customer_approver_of_the_pilot_countersigns(signed_pilot, g3):
    report = service.create_gate_report(g3.gate, g3, language="en")
    for person in (signed_pilot.charlie, signed_pilot.alice, signed_pilot.carol):
        with pytest.raises(PermissionDenied):
            service.countersign(report, person, sha256=report.sha256)
    assert Report.objects.count() == 1


def test_a_report_whose_evidence_changed_on_disk_is_refused(signed_pilot, g3):
    artifact = g3.job.artifacts.get(name="records.jsonl")
    original = artifact.path.read_bytes()
    artifact.path.chmod(0o644)
    artifact.path.write_bytes(original + b"\n")
    try:
        with pytest.raises(service.ReportError, match="records.jsonl"):
            service.create_gate_report(g3.gate, g3)
    finally:
        # The store is content-addressed and shared by the whole test run: put the evidence back.
        artifact.path.write_bytes(original)
        artifact.path.chmod(0o444)
    assert not Report.objects.exists()


def test_an_unknown_language_is_refused_by_name(g3):
    with pytest.raises(ValueError, match="'fr'"):
        service.create_gate_report(g3.gate, g3, language="fr")


def test_the_procurement_report_projects_the_gain_at_the_customers_concurrency(signed_pilot, g3):
    pilot = signed_pilot.pilot
    _evaluate(pilot, 4)
    context = procurement_report_context(pilot)
    ttft = next(row for row in context["projections"] if row["key"] == "g3-ttft-vs-local")
    cells = {c["concurrency"]: c["value"] for c in next(c for c in g3.result["criteria"] if c["key"] == "g3-ttft-vs-local")["cells"]}
    assert pilot.customer_concurrency == 24 and ttft["how"] == "interpolated"
    assert min(cells[16], cells[32]) <= ttft["value"] <= max(cells[16], cells[32])
    replay = next(row for row in context["projections"] if row["key"] == "g4-replay-speedup")
    assert replay["how"] == "own-traffic"
    sizing = context["sizing"]
    assert sizing["kv_bytes_per_token"] == 2 * 62 * 8 * 128 * 2 and sizing["kv_dtype_source"] == "vllm-default"
    # The trace's sessions end at 20,700 … 29,700 tokens; p90 is the 9th of 10: 28,700 → 28,928 in 256-token chunks.
    assert sizing["customer_sessions"] and sizing["session_tokens"] == 28700 and sizing["stored_tokens"] == 28928
    # The customer's trace holds its reuse (turn 2 extends turn 1): the capacity is read from its reuse curve
    # (docs/traces.md), with the session-length formula's figure kept beside it and the trace's scale stated.
    assert sizing["capacity_basis"] == "reuse-curve" and sizing["reuse"]["scale"]["sessions"] == 10
    assert sizing["kv_bytes"] == sizing["kv_bytes_per_token"] * sizing["reuse"]["capacity_tokens"]
    assert sizing["capacity_bytes"] == pytest.approx(sizing["kv_bytes"] * 1.10 * 1.0 * 1.25)
    assert sizing["session_formula_bytes"] == pytest.approx(sizing["kv_bytes_per_token"] * 28928 * 10000 * 1.1 * 1.25)
    report = service.create_procurement_report(pilot, language="zh-hans")
    result = service.verify_report_bytes(service.report_path(report).read_bytes())
    assert result.ok, result.reasons
    assert result.report["kind"] == "procurement" and result.report["language"] == "zh-hans"
    assert any(a.name == "G4/verdict.json" for a in result.attachments)


def test_interpolation_is_linear_in_log2_concurrency_and_never_extrapolates():
    points = [(8.0, 0.30), (16.0, 0.20), (32.0, 0.10)]
    assert interpolate(points, 16) == (0.20, "measured")
    value, how = interpolate(points, 24)
    assert how == "interpolated" and value == pytest.approx(0.20 - 0.10 * 0.5849625, rel=1e-6)
    assert interpolate(points, 64) == (None, "outside")
    assert interpolate([(16.0, 0.2)], 24) == (None, "outside")


def test_a_fresh_pilot_gets_a_procurement_report_that_proves_nothing(signed_pilot):
    report = service.create_procurement_report(signed_pilot.pilot)
    path = service.report_path(report)
    assert service.verify_report_bytes(path.read_bytes()).ok
    text = " ".join(subprocess.run(["pdftotext", str(path), "-"], capture_output=True, text=True).stdout.split())
    assert "Nothing has been proven yet" in text and "not evaluated" in text
    assert not report.simulated and "SIMULATION" not in text


@pytest.mark.parametrize("number", [1, 2, 4])
def test_every_other_gate_renders_from_the_real_judge(signed_pilot, number):
    evaluation = _evaluate(signed_pilot.pilot, number)
    report = service.create_gate_report(evaluation.gate, evaluation, language="zh-hans" if number == 2 else "en")
    result = service.verify_report_bytes(service.report_path(report).read_bytes())
    assert result.ok, result.reasons
    assert result.report["gate"] == number and result.report["verdict"] == evaluation.verdict


def test_a_signer_outside_the_configured_root_stores_nothing(g3, settings, other_ca):
    settings.FXPILOT_SIGNING_KEY = str(other_ca / "signer-key.pem")
    settings.FXPILOT_SIGNING_CERT = str(other_ca / "signer-cert.pem")
    with pytest.raises(service.ReportError, match="does not chain to a trusted root"):
        service.create_gate_report(g3.gate, g3)
    assert not Report.objects.exists()


def test_make_report_prints_the_stored_file_and_names_a_bad_argument(signed_pilot, g3):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = StringIO()
    call_command("make_report", str(signed_pilot.pilot.code), "G3", stdout=out)
    assert str(service.report_path(Report.objects.get())) in out.getvalue()
    with pytest.raises(CommandError, match="no pilot matches"):
        call_command("make_report", "no such pilot", "G3")
    with pytest.raises(CommandError, match="G7"):
        call_command("make_report", signed_pilot.pilot.name, "G7")


def test_a_procurement_report_is_countersigned_only_while_it_is_what_the_approver_read(signed_pilot):
    pilot = signed_pilot.pilot
    early = service.create_procurement_report(pilot)
    _evaluate(pilot, 3)  # evidence recorded after the report was made: signing it would sign something untrue
    with pytest.raises(service.ReportChanged, match="recorded after it"):
        service.countersign(early, signed_pilot.bob, sha256=early.sha256)
    later = service.create_procurement_report(pilot)
    with pytest.raises(service.ReportChanged, match="made after it"):
        service.countersign(early, signed_pilot.bob, sha256=early.sha256)
    with pytest.raises(service.ReportChanged, match="version read has SHA-256"):
        service.countersign(later, signed_pilot.bob, sha256=early.sha256)  # he names what he read: not this one
    signed = countersign(later, signed_pilot.bob)
    assert signed.supersedes == later and signed.signatures == 2 and signed.version == later.version
    assert service.report_bytes(signed).startswith(service.report_bytes(later))


def test_a_sizing_changed_behind_the_report_is_refused_and_the_new_version_offered(signed_pilot):
    """bob read "N units for X TB"; the admin changed the sizing (no decision, no evaluation: only the rendering
    from the database tells); the countersignature job signs nothing and offers the version that states it."""
    from gates.models import ReportJob
    from reports.tasks import run_report_job

    pilot = signed_pilot.pilot
    _evaluate(pilot, 4)
    read = service.create_procurement_report(pilot)
    pilot.sizing = {**(pilot.sizing or {}), "fx_unit_usable_tb": 0.5}
    pilot.save(update_fields=["sizing"])
    assert service.quick_change(read) is None and "what it states changed" in english(service.what_changed(read))
    job = ReportJob.objects.create(kind=ReportJob.Kind.COUNTERSIGN, pilot=pilot, report_kind=read.kind,
                                   language=read.language, requested_by=signed_pilot.bob, source=read,
                                   sha256=read.sha256)
    assert run_report_job(job.pk) == ReportJob.State.STALE
    job.refresh_from_db()
    assert "what it states changed" in job.error and job.result.supersedes == read and job.result.version == 2
    # why, as made (a catalogue sentence and its values): said in Chinese on a Chinese page, not only in English
    assert job.reason["template"].startswith("what it states changed")
    with translation.override("zh-hans"):
        said_zh = in_language(job.reason)
    assert said_zh != english(job.reason) and not re.search(r"[A-Za-z]{3,} [A-Za-z]{3,}", said_zh), said_zh
    assert not Report.objects.filter(countersigned_by__isnull=False).exists()  # nothing was signed
    assert job.result.basis_sha256 != read.basis_sha256 and service.what_changed(job.result) is None
    again = ReportJob.objects.create(kind=ReportJob.Kind.COUNTERSIGN, pilot=pilot, report_kind=read.kind,
                                     language=read.language, requested_by=signed_pilot.bob, source=job.result,
                                     sha256=job.result.sha256)
    keep_countersigned_upload(job.result, signed_pilot.bob)  # as the portal's POST keeps it for the worker
    assert run_report_job(again.pk) == ReportJob.State.DONE
    again.refresh_from_db()
    assert again.result.countersigned_by == signed_pilot.bob and again.result.supersedes == job.result
    assert run_report_job(again.pk) == "not queued"  # a second delivery signs nothing twice


def test_stored_bytes_that_differ_from_the_row_are_not_countersigned(signed_pilot, g3):
    report = service.create_gate_report(g3.gate, g3)
    path = service.report_path(report)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes() + b"%% appended\n")
    with pytest.raises(service.ReportChanged, match="stored file differs"):
        service.countersign(report, signed_pilot.bob, sha256=report.sha256)
    assert Report.objects.count() == 1


def test_every_reason_a_report_went_stale_is_a_catalogue_sentence_said_in_chinese(signed_pilot, g3):
    """Why nothing was signed is made as a sentence of the catalogue and its values where it is found, so a
    Chinese page says it in Chinese (issue 27: the reason was shown on English pages only)."""
    report = service.create_gate_report(g3.gate, g3)
    reasons = []
    with pytest.raises(service.ReportChanged) as named_another:
        service.countersign(report, signed_pilot.bob, sha256="f" * 64)
    reasons.append(named_another.value.finding)
    later = service.new_version(report)
    reasons.append(service.quick_change(report))
    _evaluate(signed_pilot.pilot, 3)
    reasons.append(service.what_changed(later))
    path = service.report_path(later)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes() + b"%% appended\n")
    Report.objects.filter(pk=later.pk).update(created=later.created.replace(year=later.created.year + 1))
    later.refresh_from_db()
    reasons.append(service.what_changed(later))
    templates = [reason["template"] for reason in reasons]
    assert templates == ["the version read has SHA-256 %(named)s…, not this one's %(sha256)s…",
                         "version %(number)s (%(code)s) was made after it",
                         "a decision or an evaluation was recorded after it was made",
                         "its stored file differs from the one made (%(error)s)"]
    for reason in reasons:
        with translation.override("zh-hans"):
            said_zh = in_language(reason)
        assert said_zh != english(reason), f"{reason['template']!r} is not translated"
        without_values = said_zh
        for value in reason["values"].values():
            without_values = without_values.replace(value, "")
        assert not re.search(r"[A-Za-z]{3,} [A-Za-z]{3,}", without_values), said_zh


def test_two_workers_rendering_the_same_report_store_one_new_version(signed_pilot, g3):
    """Two decisions in a row queue two renderings that a worker with several processes runs at once: the one that
    stores second finds the version it supersedes superseded already, stores nothing, and looks again."""
    first = service.create_gate_report(g3.gate, g3)
    second = service.new_version(first)
    stored = sorted(p.name for p in service.report_path(first).parent.iterdir())
    with pytest.raises(service.SupersededMeanwhile):  # the other worker, which had read `first` as the latest
        service._make(service._context_now(first), pilot=signed_pilot.pilot, gate=first.gate,
                      evaluation=first.evaluation, language="en", who=None, supersedes=first)
    assert Report.objects.count() == 2 and sorted(p.name for p in service.report_path(first).parent.iterdir()) == stored
    assert service.offered_version(first) == second  # looking again finds the version now current
