"""Plan thresholds in the unit the page shows them in, checked for their range (issue 27, item 6): a fraction is
entered and shown in percent and stored as the fraction the plan file holds; a share is 0–100 %, a count a whole
number ≥ 0, a speed-up > 0; the error names the field, in English and in Chinese."""
from __future__ import annotations

import pytest
from django.urls import reverse

from gates.models import AuditEvent
from tests.portal.test_plan_and_gates import edit


def _criterion(demo, key):
    return demo.pilot.latest_plan.criteria.get(key=key)


@pytest.mark.parametrize("key, typed, said", [
    ("g2-hit-ratio", "150", "Threshold (%) is a share: from 0 % to 100 %, not 150 %."),
    ("g2-hit-ratio", "-5", "Threshold (%) is a share: from 0 % to 100 %, not -5 %."),
    ("g1-gpu-count", "-5", "Threshold (GPUs) is a count: a whole number, 0 or more, not -5."),
    ("g1-gpu-count", "7.5", "Threshold (GPUs) is a count: a whole number, 0 or more, not 7.5."),
    ("g3-speedup-recompute", "0", "Threshold (×) is a speed-up: more than 0×, not 0."),
    ("g3-ttft-vs-local", "150", "Threshold (%) is a reduction: from −100 % to 100 %, not 150 %."),
    ("g2-no-failures", "-1", "is a count: a whole number, 0 or more, not -1."),
])
def test_a_threshold_out_of_its_range_is_refused_naming_the_field(client, demo, key, typed, said):
    client.force_login(demo.alice)
    before = _criterion(demo, key).threshold
    page = edit(client, demo.pilot, key, threshold=typed).content.decode()
    assert key in page and said in page.replace("&#x27;", "'"), page[page.find("msg error"):][:400]
    assert _criterion(demo, key).threshold == before
    assert not AuditEvent.objects.filter(action="criterion.edited").exists()


def test_a_share_is_entered_in_percent_and_stored_as_a_fraction(client, demo):
    client.force_login(demo.alice)
    page = client.get(reverse("plan", args=[demo.pilot.code])).content.decode()
    assert 'name="g2-hit-ratio-threshold" value="90.0"' in page  # shown as the page reads it: 90 %
    assert 'name="g2-hit-ratio-confidence" value="95.0"' in page
    edit(client, demo.pilot, "g2-hit-ratio", threshold="85", confidence="90")
    criterion = _criterion(demo, "g2-hit-ratio")
    assert criterion.threshold == 0.85 and criterion.confidence == 0.9
    assert "85 %" in client.get(reverse("plan", args=[demo.pilot.code])).content.decode()


def test_saving_an_unchanged_form_changes_nothing(client, demo):
    client.force_login(demo.alice)
    criterion = _criterion(demo, "g3-throughput-vs-local")
    edit(client, demo.pilot, "g3-throughput-vs-local", op=criterion.op, threshold="20", confidence="95",
         concurrency=", ".join(str(c) for c in criterion.concurrency or []))
    assert _criterion(demo, "g3-throughput-vs-local").threshold == 0.2
    assert not AuditEvent.objects.filter(action="criterion.edited").exists()


def test_a_confidence_out_of_range_is_refused(client, demo):
    client.force_login(demo.alice)
    page = edit(client, demo.pilot, "g2-hit-ratio", threshold="90", confidence="0.95").content.decode()
    assert "Confidence level (%) is from 50 % to 99.9 %, not 0.95 %." in page


def test_the_refusal_is_said_in_chinese(client, demo):
    client.force_login(demo.alice)
    client.post(reverse("set_language"), {"language": "zh-hans"})
    page = edit(client, demo.pilot, "g2-hit-ratio", threshold="150").content.decode()
    assert "150 %" in page and "0 % 到 100 %" in page
