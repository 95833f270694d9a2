"""The uploaded trace lives in the evidence store, re-hashed on every read and download; every refusal of a run
or a trace reads in Chinese for a Chinese reader."""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
from django.core.files.storage import storages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import translation

from runners import traces
from runners.models import Job, Node, Site
from runners.runs import RunRefused, validate_params
from tests.orchestration.conftest import open_gate
from tests.reports.test_traces import GOOD
from tests.traces.helpers import run_trace_jobs

ROOT = Path(__file__).resolve().parents[2]
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(autouse=True)
def english_afterwards():
    """A page request activates its reader's language for the thread; the next test starts in English again."""
    yield
    translation.activate("en")


def test_the_trace_is_kept_in_the_evidence_store_and_refused_once_altered(signed_pilot, settings):
    trace = traces.upload(signed_pilot.pilot.gate(4), GOOD, "ours.csv", signed_pilot.bob, "customer")
    assert storages["evidence"].exists(trace.path) and trace.path.startswith(f"traces/{signed_pilot.pilot.code}/")
    assert traces.read(trace) == GOOD
    stored = Path(storages["evidence"].path(trace.path))
    os.chmod(stored, 0o644)
    stored.write_bytes(GOOD.replace(b"3000", b"3001"))
    try:
        with pytest.raises(traces.TraceRefused, match="ours.csv cannot be used: .*no longer hashes"):
            traces.trace_for_run(signed_pilot.pilot.gate(4))
    finally:
        stored.write_bytes(GOOD)


def test_the_trace_downloads_re_hashed_for_its_pilot_only(signed_pilot, client):
    pilot = signed_pilot.pilot
    trace = traces.upload(pilot.gate(4), GOOD, "ours.csv", signed_pilot.bob, "customer")
    url = reverse("gate_trace_download", args=[pilot.code, 4, trace.pk])
    client.force_login(signed_pilot.carol)
    assert f'href="{url}"' in client.get(reverse("gate", args=[pilot.code, 4])).content.decode()
    response = client.get(url)
    assert response.status_code == 200 and b"".join(response.streaming_content) == GOOD
    assert response["X-Content-SHA256"] == trace.sha256 and 'filename="ours.csv"' in response["Content-Disposition"]
    assert client.get(reverse("gate_trace_download", args=[pilot.code, 3, trace.pk])).status_code == 404
    client.force_login(signed_pilot.charlie)
    assert client.get(url).status_code == 404


@pytest.mark.parametrize("data", [
    b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,ten,1,0\n",
    b"session_id,turn\n",
    b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,10,1\n",
    b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\n,1,10,1,0\n",
    b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,10,1,soon\n",
    b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,10,1,-1\n",
    b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,10,1,0\na,1,10,1,0\n",
    b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\n",
    b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,0,10,1,0\n",
    b"\n",
    b"",
])
def test_every_complaint_about_a_trace_reads_in_chinese(data):
    with translation.override("en"), pytest.raises(traces.TraceRefused) as english:
        traces.parse(data, "ours.csv")
    with translation.override("zh-hans"), pytest.raises(traces.TraceRefused) as chinese:
        traces.parse(data, "ours.csv")
    assert str(chinese.value) != str(english.value) and CJK.search(str(chinese.value)), str(chinese.value)
    assert str(chinese.value).startswith("ours.csv")
    # What is left in Latin letters is the file's own words (its name, columns, values), not English sentences.
    assert not re.search(r"\b(is|the|must|line|column|fields|already|missing|expected)\b", str(chinese.value))


def test_a_refused_run_reads_in_chinese_in_the_portal(signed_pilot, client):
    pilot = signed_pilot.pilot
    site = Site.objects.create(pilot=pilot, name="site1", queue="q-site1")
    Node.objects.create(site=site, name="node1", host="127.0.0.1", username="fxpilot", simulated=True)
    open_gate(pilot, 4, signed_pilot)
    client.force_login(signed_pilot.alice)
    client.post(reverse("set_language"), {"language": "zh-hans", "next": "/"})
    page = client.post(reverse("run_start", args=[pilot.code, 4]), follow=True).content.decode()
    assert "G4 需要客户的会话轨迹：请在 G4 页面上传" in page and "needs the customer" not in page
    assert not Job.objects.exists()
    client.post(reverse("gate_trace", args=[pilot.code, 4]), {"trace": SimpleUploadedFile(
        "bad.csv", b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,ten,1,0\n")})
    assert run_trace_jobs() == ["refused"]     # the worker reads it; its page says why, in the reader's language
    page = client.get(reverse("pilot_traces", args=[pilot.code])).content.decode()
    assert "bad.csv，第 2 行，prompt_tokens 列：&#x27;ten&#x27; 不是整数" in page
    with translation.override("zh-hans"), pytest.raises(RunRefused, match="params.repetitions：0 不是≥ 1 的整数"):
        validate_params({"repetitions": 0})


REFUSALS = {"RunRefused", "TraceRefused"}  # LeaseRefused also words the waiting line of the log: English


def test_no_refusal_in_runners_is_an_untranslated_sentence():
    """A refusal is raised with gettext's words (or passes another refusal on), never with an English literal."""
    found = []
    for path in sorted((ROOT / "runners").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                name = getattr(node.exc.func, "id", getattr(node.exc.func, "attr", ""))
                args = node.exc.args
                if name in REFUSALS and args and isinstance(args[0], (ast.JoinedStr, ast.Constant, ast.BinOp)):
                    literal = args[0]
                    if isinstance(literal, ast.BinOp):  # "…" % {...} without gettext
                        literal = literal.left
                    if isinstance(literal, (ast.JoinedStr, ast.Constant)):
                        found.append(f"{path.name}:{node.lineno}")
    assert not found, f"refusals raised with English literals: {found}"


def test_every_runners_catalogue_entry_has_its_chinese():
    po = (ROOT / "locale/zh_Hans/LC_MESSAGES/django.po").read_text(encoding="utf-8")
    missing = []
    for block in po.split("\n\n"):
        if "#: runners/" not in block or block.lstrip().startswith("#~"):
            continue
        if "#, fuzzy" in block or re.search(r'msgstr ""\s*$', block):
            missing.append(block.split("msgid", 1)[1][:100])
    assert not missing, missing
