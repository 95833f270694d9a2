"""Item 7 of issue 24: the trace uploaded on the pilot at any stage, analysed by a worker (never in the web request),
its analysis on the trace page and the overview, in English and Chinese; nobody outside the pilot sees any of it."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from gates.models import CustomerTrace, Pilot
from gates.traces.predict import full_hit_speedup, predicted_gain
from runners import traces
from tests.traces.helpers import mooncake_lines

pytestmark = pytest.mark.django_db


def conversation_trace(sessions: int = 40, turns: int = 4) -> bytes:
    """Mooncake JSONL with a shared system block and sessions whose turns extend their previous prompt."""
    rows, block = [], 1000
    for s in range(sessions):
        ids = [0]
        for t in range(turns):
            ids = ids + list(range(block, block + 3))
            block += 3
            rows.append({"timestamp": 1000 * (s * 7 + t * 60), "input_length": 512 * len(ids) - 100,
                         "output_length": 50, "hash_ids": list(ids)})
    rows.sort(key=lambda r: r["timestamp"])
    return mooncake_lines(rows).encode()


def upload(client, pilot: Pilot, data: bytes, name: str = "conv.jsonl"):
    return client.post(reverse("pilot_trace_upload", args=[pilot.code]), {"trace": SimpleUploadedFile(name, data)})


def test_a_draft_pilot_takes_the_trace_and_a_worker_analyses_it(demo, client):
    pilot = demo.pilot
    assert pilot.state == Pilot.State.DRAFT            # before anyone signed: any stage
    client.force_login(demo.carol)
    response = upload(client, pilot, conversation_trace())
    row = CustomerTrace.objects.get()
    assert response.status_code == 302 and response.url == reverse("pilot_trace", args=[pilot.code, row.pk])
    assert row.state == "queued" and row.progress == 0 and not row.analysis       # nothing read in the request
    page = client.get(response.url).content.decode()
    assert "being read and analysed" in page and 'hx-get="' + reverse("pilot_trace_progress", args=[pilot.code, row.pk])
    assert json.loads(client.get(reverse("pilot_trace_progress", args=[pilot.code, row.pk])).content)["state"] == "queued"
    assert traces.current(pilot.gate(4)) is None       # G4 replays nothing still being read
    assert traces.analyse_row(row.pk) == "ready"
    assert traces.analyse_row(row.pk) == "not queued"  # a redelivered task leaves it
    row.refresh_from_db()
    assert (row.state, row.progress, row.format, row.turns, row.sessions) == ("ready", 1.0, "mooncake", 160, 40)
    assert traces.current(pilot.gate(4)) == row
    progress = client.get(reverse("pilot_trace_progress", args=[pilot.code, row.pk]), HTTP_HX_REQUEST="true")
    assert progress["HX-Refresh"] == "true"
    page = client.get(reverse("pilot_traces", args=[pilot.code])).content.decode()
    for words in ("Reuse share:", "Capacity that captures 95 %", "Predicted gain", "Arrivals over time",
                  "Context lengths", "Reuse-time distribution", "Reuse captured against cache capacity",
                  "not a measurement"):
        assert words in page, words
    overview = client.get(reverse("pilot", args=[pilot.code])).content.decode()
    assert 'id="trace-reuse"' in overview and "Predicted gain" in overview


def test_a_bad_trace_is_refused_by_the_worker_naming_line_and_field_and_the_good_one_stays(signed_pilot, client):
    pilot = signed_pilot.pilot
    client.force_login(signed_pilot.bob)
    upload(client, pilot, conversation_trace(5, 2))
    good = CustomerTrace.objects.get()
    traces.analyse_row(good.pk)
    bad = conversation_trace(3, 1).decode().splitlines()
    bad[1] = bad[1].replace('"input_length": ', '"input_length": 1.5, "x": ')
    upload(client, pilot, ("\n".join(bad) + "\n").encode(), "broken.jsonl")
    refused = CustomerTrace.objects.exclude(pk=good.pk).get()
    assert traces.analyse_row(refused.pk) == "refused"
    refused.refresh_from_db()
    assert "broken.jsonl (Mooncake/FAST'25 JSONL), line 2, field input_length" in refused.refusal["en"]
    assert "第 2 行" in refused.refusal["zh-hans"] and "input_length" in refused.refusal["zh-hans"]
    assert traces.current(pilot.gate(4)) == good           # loses nothing: G4 still replays the good one
    page = client.get(reverse("pilot_trace", args=[pilot.code, refused.pk])).content.decode()
    assert "broken.jsonl was refused" in page and "line 2, field input_length" in page


def test_a_format_without_reuse_says_so_and_little_reuse_reads_as_the_traffic(signed_pilot, client):
    pilot = signed_pilot.pilot
    client.force_login(signed_pilot.alice)
    azure = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.6805900,{1000 + i},{10 + i}\n" for i in range(30))
    upload(client, pilot, azure.encode(), "azure.csv")
    traces.analyse_row(CustomerTrace.objects.get().pk)
    page = client.get(reverse("pilot_traces", args=[pilot.code])).content.decode()
    assert "Reuse unknown." in page and "Predicted gain" not in page and "Arrivals over time" in page
    little = mooncake_lines([{"timestamp": i * 1000, "input_length": 5000, "output_length": 5,
                              "hash_ids": [i * 10 + k for k in range(10)]} for i in range(20)]
                            + [{"timestamp": 30000, "input_length": 5000, "output_length": 5,
                                "hash_ids": [0] + [999 + k for k in range(9)]}])
    upload(client, pilot, little.encode(), "little.jsonl")
    traces.analyse_row(CustomerTrace.objects.order_by("-id").first().pk)
    page = client.get(reverse("pilot_traces", args=[pilot.code])).content.decode()
    assert "This traffic has little reuse." in page and "not an FX failure" in page


def test_nobody_outside_the_pilot_sees_its_trace(signed_pilot, client):
    pilot = signed_pilot.pilot
    client.force_login(signed_pilot.bob)
    upload(client, pilot, conversation_trace(3, 2))
    row = CustomerTrace.objects.get()
    traces.analyse_row(row.pk)
    client.force_login(signed_pilot.charlie)
    for url in (reverse("pilot_traces", args=[pilot.code]), reverse("pilot_trace", args=[pilot.code, row.pk]),
                reverse("pilot_trace_progress", args=[pilot.code, row.pk]),
                reverse("gate_trace_download", args=[pilot.code, 4, row.pk])):
        assert client.get(url).status_code == 404, url
    assert upload(client, pilot, conversation_trace(2, 1)).status_code == 404
    assert CustomerTrace.objects.count() == 1


def test_the_trace_page_in_chinese(signed_pilot, client):
    pilot = signed_pilot.pilot
    client.force_login(signed_pilot.bob)
    upload(client, pilot, conversation_trace(6, 3))
    traces.analyse_row(CustomerTrace.objects.get().pk)
    client.post(reverse("set_language"), {"language": "zh-hans"})
    page = client.get(reverse("pilot_traces", args=[pilot.code])).content.decode()
    for words in ("复用份额", "预测", "到达", "上下文长度", "复用时间分布"):
        assert words in page, words


def test_a_16_mb_upload_is_kept_without_being_read_in_the_request(signed_pilot, client, monkeypatch):
    """The web request hashes and keeps the file; reading and analysing it is the worker's (how fast the answer
    comes is a benchmark's question, not this test's)."""
    line = json.dumps({"timestamp": 0, "input_length": 2048, "output_length": 10, "hash_ids": [1, 2, 3, 4]}) + "\n"
    data = (line * (16_000_000 // len(line))).encode()     # 16 MB
    client.force_login(signed_pilot.bob)

    def no_reading(*args, **kwargs):
        raise AssertionError("the trace was read in the web request")

    for name in ("analyse_bytes", "analyse_file", "parse"):
        monkeypatch.setattr(traces, name, no_reading)
    response = upload(client, signed_pilot.pilot, data, "big.jsonl")
    row = CustomerTrace.objects.get()
    assert response.status_code == 302 and row.state == "queued" and row.size == len(data)
    assert row.analysis in (None, {}) and not row.turns


def test_the_prediction_is_amdahl_on_the_published_reference():
    reference = {"fx": {8: [7.53, 56.6], 16: [11.85, 74.9], 32: [26.35, 71.6]}, "recompute": {16: [149.48, 4.1]}}
    assert full_hit_speedup(reference, 16) == (149.48 / 11.85, 16)
    assert full_hit_speedup(reference, 64)[1] == 16     # the nearest level with both arms published
    found = predicted_gain({"known": True, "ideal_hit_fraction": 0.5}, reference, 16, share=1.0, bar=2.0)
    full = 149.48 / 11.85
    assert found["speedup"] == pytest.approx(1 / (0.5 + 0.5 / full)) and found["meets_bar"] is False
    assert predicted_gain({"known": False}, reference, 16) is None
    assert predicted_gain({"known": True, "ideal_hit_fraction": 0.9}, {"fx": {8: [1, 1]}}, 8) is None


def test_the_worker_reports_its_progress_by_stage():
    seen = []
    found = traces.analyse_bytes(conversation_trace(4, 2), "c.jsonl", lambda value, stage: seen.append((value, stage)))
    assert [stage for _, stage in seen][0] == "reading" and [s for _, s in seen][-2:] == ["reuse", "summary"]
    assert [v for v, _ in seen] == sorted(v for v, _ in seen) and found["turns"] == 8


def test_a_worker_takes_over_an_analysis_only_once_its_analyser_went_silent(demo, settings):
    data = conversation_trace(10, 2)
    row = traces.receive(demo.pilot, data, "conv.jsonl", demo.carol, "customer")
    CustomerTrace.objects.filter(pk=row.pk).update(state="analysing", stage="reuse", heartbeat=timezone.now())
    assert traces.analyse_row(row.pk) == "not queued"      # another worker showed progress just now
    stale = timezone.now() - timedelta(seconds=settings.FXPILOT_STALE_SECONDS + 1)
    CustomerTrace.objects.filter(pk=row.pk).update(heartbeat=stale)
    assert traces.analyse_row(row.pk) == "ready"           # that worker died mid-analysis: this one finishes it
    row.refresh_from_db()
    assert row.turns == 20 and row.heartbeat > stale
