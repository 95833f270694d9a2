"""The demo's order (portal/management/commands/demo.py): G4 signed off by both parties, its gate report
countersigned, then the procurement report: that report is current when the demo ends, so the approver's first
countersignature signs it (no version 2)."""
from __future__ import annotations

import pytest
from django.utils import translation

from gates import lifecycle
from gates.models import Report
from reports import findings, service
from tests.reports.countersign_helpers import countersign, use_customer_side
from tests.reports.test_service import _evaluate
from tests.reports.test_truth import _walk_to


@pytest.fixture(autouse=True)
def _customer_side(tmp_path, monkeypatch):
    use_customer_side(monkeypatch, tmp_path)


@pytest.fixture
def walked(signed_pilot):
    signed_pilot.pilot.signed_people = (signed_pilot.alice, signed_pilot.bob)
    return signed_pilot


def test_the_demos_procurement_report_is_current_and_countersignable(walked):
    pilot = walked.pilot
    _walk_to(pilot, 4)
    g4 = _evaluate(pilot, 4)
    gate = pilot.gate(4)
    lifecycle.record_verdict(gate, g4, who="test")
    service.create_gate_report(gate, g4)  # the run's report step
    lifecycle.sign_off_gate(gate, walked.bob, decision="approve", comment="G4 evidence reviewed.")
    lifecycle.sign_off_gate(gate, walked.alice, decision="approve", comment="G4 evidence reviewed.")
    gate_report = gate.reports.filter(kind=Report.Kind.GATE).order_by("-created").first()
    offered = service.offered_version(gate_report, who="demo")
    countersign(offered, walked.bob)
    pilot.refresh_from_db()
    report = service.create_procurement_report(pilot)
    for language in ("en", "zh-hans"):
        with translation.override(language):
            changed = service.what_changed(report)
            assert changed is None, findings.english(changed)
    signed = countersign(report, walked.bob)
    assert signed.version == 1 and signed.signatures == 2
