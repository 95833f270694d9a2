"""G4's report words true for every verdict, the trace's own file name, one rounding rule, and the tier shares and
predicted-vs-measured account printed from what the run and the verdict hold ("not measured" where they hold none)."""
from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from gates import lifecycle
from gates.models import CustomerTrace, Party
from reports import service
from reports.context import predicted_vs_measured, tier_share_table
from reports.units import percent, rounded
from runners.artifacts import store_bytes
from tests.reports.test_service import CUSTOMER_TRACE, _evaluate
from tests.reports.test_truth import _walk_to


@pytest.fixture
def walked(signed_pilot):
    signed_pilot.pilot.signed_people = (signed_pilot.alice, signed_pilot.bob)
    return signed_pilot


def _text(report) -> str:
    done = subprocess.run(["pdftotext", "-layout", str(service.report_path(report)), "-"], capture_output=True,
                          text=True, check=True)
    return " ".join(done.stdout.split())


def test_one_rounding_rule_half_up_from_the_shortest_decimal():
    assert str(rounded(37.35, 1)) == "37.4" and str(rounded(0.125, 2)) == "0.13"
    assert percent(0.3735) == "37.4 %" and percent(0.31349) == "31.3 %" and percent(None) == "—"


SAMPLE = {"schema": "fxpilot.replay-sample/1", "trace_ideal_hit_fraction": 0.3735, "sampled_requests": 20,
          "trace_requests": 20, "sampled_share": 1.0, "sampled_sessions": 10, "format_name": "fxpilot CSV",
          "sizing": {"needs_tier": False, "hbm_tokens": 100000, "dram_tokens": 400000, "working_set_tokens": 250000},
          "oracle": {"ideal_hit_tokens": 1000, "ideal_hit_fraction": 0.5, "input_tokens": 2000, "strata": {},
                     "tiers": {"overall": {"share": {"hbm": 0.3, "dram": 0.15, "fx": 0.05, "recompute": 0.5}}}}}


def _g4(walked, verdict: str, *, sample: dict | None = None, tier_shares: dict | None = None):
    pilot = walked.pilot
    _walk_to(pilot, 4)
    g4 = _evaluate(pilot, 4)
    result = dict(g4.result, verdict=verdict)
    if tier_shares is None:
        result.pop("tier_shares", None)
    else:
        result["tier_shares"] = tier_shares
    g4.verdict, g4.result = verdict, result
    g4.save()
    if sample is not None:  # the figures this test states, in place of the synthetic run's own sample
        g4.job.artifacts.filter(name="replay-sample.json").delete()
        store_bytes(g4.job, "replay-sample.json", json.dumps(sample).encode(), kind="replay-sample", simulated=True)
    return pilot, g4


def test_a_failed_g4_report_never_says_the_gain_holds_and_names_the_customers_file(walked):
    pilot, g4 = _g4(walked, "fail")
    CustomerTrace.objects.create(pilot=pilot, gate=pilot.gate(4), name="mooncake-conversation-week.csv",
                                 path="traces/x", sha256=hashlib.sha256(CUSTOMER_TRACE).hexdigest(),
                                 size=len(CUSTOMER_TRACE), party=Party.CUSTOMER)
    lifecycle.record_verdict(pilot.gate(4), g4, who="test")
    text = _text(service.create_gate_report(pilot.gate(4), g4))
    assert "The gain holds for this customer's traffic and in operation." not in text.replace(
        "not established by this evaluation: The gain holds", "")
    assert "What this gate sets out to prove — not established by this evaluation" in text
    assert "This evaluation passed" not in text
    assert "mooncake-conversation-week.csv" in text and "customer-trace.csv" not in text.split("Manifest")[0]
    assert "Tier shares: not measured" in text  # the verdict states none: never invented


def test_the_account_prints_the_sample_and_the_verdicts_figures_and_not_measured_where_there_are_none(walked):
    tiers = {"basis": "test", "arms": [
        {"arm": "fx", "phase": "replay", "hbm": 0.25, "dram": 0.1, "disk": 0.15, "recomputed": 0.5,
         "disk_tier": "fx", "disk_source": "device bytes ÷ KV bytes per token",
         "strata": {"returning": {"requests": 10, "hbm": 0.4, "dram": 0.2, "disk": 0.3, "recomputed": 0.1}}},
        {"arm": "dram", "phase": "replay", "hbm": 0.25, "dram": 0.2, "disk": 0.0, "recomputed": 0.55,
         "disk_tier": None, "disk_source": "no disk tier"}]}
    pilot, g4 = _g4(walked, "pass", sample=SAMPLE, tier_shares=tiers)
    table = tier_share_table(g4)
    assert [(r["arm"], r["stratum"], r["fx"]) for r in table["rows"]] == [
        ("fx", "", 0.15), ("fx", "returning", 0.3), ("dram", "", 0.0)]
    account = predicted_vs_measured(g4, pilot)
    assert account["trace_ideal"] == 0.3735 and account["sample_ideal"] == 0.5 and account["predicted_fx"] == 0.05
    assert account["repetitions"] == []  # no phase summary with device bytes in this run: not measured
    assert any("holds more reuse" in r["template"] for r in account["reasons"])
    assert any("fits in HBM and DRAM" in r["template"] for r in account["reasons"])
    lifecycle.record_verdict(pilot.gate(4), g4, who="test")
    text = _text(service.create_gate_report(pilot.gate(4), g4))
    assert "Where the prompt tokens came from: HBM, DRAM, FX" in text and "30.0 %" in text
    assert "Predicted and measured" in text and "37.4 %" in text and "50.0 %" in text and "5.0 %" in text
    assert "FX share measured per repetition not measured" in text
    assert "FX's gain beyond DRAM" in text
    assert "the sample (whole sessions, chosen by hash) holds more reuse than the trace" in text
    for person in pilot.signed_people:
        lifecycle.sign_off_gate(pilot.gate(4), person, decision="approve")
    pilot.refresh_from_db()
    procurement = _text(service.create_procurement_report(pilot))
    assert "Your traffic" in procurement and "Predicted and measured" in procurement and "37.4 %" in procurement


def test_a_gain_whose_interval_spans_more_than_ten_times_is_undetermined_not_a_headline():
    from reports.words import gain_sentence

    row = {"value": 228.0, "unit": "×", "ci": [2.96, 17549.0], "confidence": 0.96, "metric": "ttft",
           "comparison": "speedup", "candidate": "fx", "baseline": "recompute", "how": "sample-trace"}
    sentence = gain_sentence(row, "FX100", 16)
    assert "undetermined" in sentence and "228" not in sentence and "17,549" in sentence
    narrow = gain_sentence(dict(row, value=4.2, ci=[3.1, 5.6]), "FX100", 16)
    assert "4.2" in narrow and "undetermined" not in narrow
