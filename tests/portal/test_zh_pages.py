"""Every portal page in Simplified Chinese leaves no English sentence untranslated (names, units and codes aside).

One pilot is taken through its life with the test client — draft plan, signed plan, a node waiting for its host key,
G1–G3 judged by the real judge and signed off, the customer's trace uploaded on G4, G4 judged and awaiting sign-off,
the pilot completed with its reports — and each page a person reads on the way is rendered in zh-hans. A text node
with two English words in a row is a sentence a Chinese reader would have to translate.
"""
from __future__ import annotations

import hashlib
import re
from html.parser import HTMLParser
from pathlib import Path

from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_noop

from gates import lifecycle
from gates.models import Organisation, Profile, Report, UploadVerification
from reports.context import root_certificate
from reports.findings import english, said
from runners import output
from runners.models import Status, Step
from tests.portal.conftest import add_lab
from tests.reports.test_service import CUSTOMER_TRACE, _evaluate
from tests.reports.test_truth import _walk_to
from tests.traces.helpers import run_trace_jobs

# Two English words of letters in a row (a hyphen or apostrophe joins a word, it does not end it).
SENTENCE = re.compile(r"(?<![\w.-])[A-Za-z][A-Za-z’'-]*[a-z][A-Za-z’'-]*(?:[ ,;:]{1,3}[A-Za-z][A-Za-z’'-]*[a-z]\b)+")

# Proper names, units and codes a Chinese page keeps as they are.
ALLOWED = [
    "vLLM", "LMCache", "FX100", "FX", "MI308X", "MI300X", "SSH", "TTFT", "TPOT", "NVMe-oF", "NVMe", "RoCEv2", "RoCE",
    "ROCm", "PAdES", "PDF/A-3b", "PDF", "SHA-256", "SHA256", "CSV", "JSON", "HBM", "DRAM", "GPU", "GPUs", "CPU", "KV",
    "Celery", "Redis", "PostgreSQL", "OpenSSH", "Chromium", "Adobe Acrobat", "pyHanko", "fxpilot", "amd-smi", "fio",
    "nvme-cli", "bf16", "fp8", "FP8", "p50", "p90", "p99", "ms", "GB/s", "TB", "GB", "MB", "KB", "B", "req/s", "tok/s",
    "Qwen", "Coder", "Instruct", "Simulated lab",
]
# Machine values shown as they are: file names, hashes and fingerprints, UUIDs, keys and identifiers, paths.
CODES = [
    r"\S+\.(?:csv|jsonl?|pdf|pem|yaml|txt|log|sh|py|png)\b",
    r"SHA256:[\w+/=]+",
    r"\b[0-9a-f]{8,}(?:-[0-9a-f]{4,})*\b",
    r"[\w.+-]+/[\w./+-]+",
    r"\b[a-z0-9]+(?:[-_.][a-z0-9]+)+\b",
    r"\b[a-z]+\d+\b",
    r"ssh-ed25519 \S+",
]
SKIPPED = {"script", "style", "code", "pre", "kbd", "samp"}


class _Text(HTMLParser):
    """Text nodes and the attributes a person reads (title, placeholder, aria-label, alt), outside code."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.texts: list[str] = []
        self.stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("title", "placeholder", "aria-label", "alt") and value:
                self.texts.append(value)
        if tag not in ("br", "img", "input", "meta", "link", "hr", "col", "wbr", "source"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.stack:
            while self.stack and self.stack.pop() != tag:
                pass

    def handle_data(self, data):
        if data.strip() and not SKIPPED & set(self.stack):
            self.texts.append(data)


def english_sentences(texts, data=()) -> list[str]:
    """The English runs of two or more words left in `texts` after the data a person typed, names and codes."""
    found = []
    names = sorted({*data, *ALLOWED}, key=len, reverse=True)
    for text in texts:
        text = " ".join(text.split())
        for pattern in CODES:
            text = re.sub(pattern, " ", text)
        for name in names:
            text = re.sub(rf"(?<![A-Za-z]){re.escape(name)}(?![A-Za-z])", " ", text)
        found += [match.group(0) for match in SENTENCE.finditer(text)]
    return found


def page_sentences(html: str, data=()) -> list[str]:
    parser = _Text()
    parser.feed(html)
    return english_sentences(parser.texts, data)


def root_names() -> list[str]:
    """The vendor root's subject (its names, e.g. "fxpilot evidence root"), which the verify page prints as it is."""
    subject = root_certificate()["subject"]
    return [part.partition("=")[2] for part in subject.split(",") if "=" in part]


def _names(world) -> list[str]:
    """What people typed: the pilot's, organisations', people's, site's and node's names."""
    pilot = world.pilot
    people = [world.alice, world.bob, world.carol, world.charlie]
    return [pilot.name, *Organisation.objects.values_list("name", flat=True), *(p.get_full_name() for p in people),
            *(p.username for p in people), "Lab", "lab key", "node1", "ours.csv", "fxpilot evidence signer",
            *root_names()]


def _fake_report(pilot, gate, evaluation, kind, *, supersedes=None, by=None) -> Report:
    relative = Path("reports") / str(pilot.code) / f"{kind}-{gate and gate.number}-{supersedes and 2 or 1}.pdf"
    (Path(settings.DATA_DIR) / relative).parent.mkdir(parents=True, exist_ok=True)
    data = b"%PDF-1.7\n% a fixture report\n"
    (Path(settings.DATA_DIR) / relative).write_bytes(data)
    return Report.objects.create(pilot=pilot, gate=gate, evaluation=evaluation, kind=kind, path=str(relative),
                                 sha256=hashlib.sha256(data).hexdigest(), size=len(data), simulated=True,
                                 language="zh-hans", version=2 if supersedes else 1, supersedes=supersedes,
                                 signatures=2 if by else 1, countersigned_by=by,
                                 countersigned_at=timezone.now() if by else None)


def _refused() -> dict:
    """A refused verification shaped as the worker stores it: each finding as made (reports.findings) and in English."""
    no_files = said(gettext_noop("the PDF has no attached files; an evidence report carries its raw artifacts and "
                                 "manifest.json"))
    changed = said(gettext_noop("the signed bytes were changed (digest mismatch)"))
    missing = said(gettext_noop("listed in the manifest but not attached"))
    findings = [no_files, said(gettext_noop("signature %(field)s (%(signer)s): %(problem)s"), field="'Signature1'",
                               signer="fxpilot evidence signer", problem=changed),
                said(gettext_noop("attachment %(name)s: %(problem)s"), name="'records.jsonl'", problem=missing)]
    return {"ok": False, "metadata": {}, "report": {}, "reasons": [english(f) for f in findings], "findings": findings,
            "signatures": [{"field": "Signature1", "signer": "fxpilot evidence signer", "issuer": "fxpilot",
                            "signing_time": None, "ok": False, "problems": [english(changed)],
                            "problem_findings": [changed]}],
            "attachments": [{"name": "records.jsonl", "file": "records.jsonl", "actual_sha256": "1" * 64,
                             "ok": False, "problem": english(missing), "problem_finding": missing}]}


def _verified(pilot, report) -> dict:
    """A verification result shaped as the worker stores it (gates.tasks.verify_upload)."""
    return {"ok": True, "reasons": [], "metadata": {},
            "signatures": [{"field": "Signature1", "signer": "fxpilot evidence signer", "issuer": "fxpilot",
                            "signing_time": "2026-12-01T10:00:00+00:00", "ok": True, "problems": []}],
            "attachments": [{"name": "verdict.json", "file": "verdict.json", "actual_sha256": "0" * 64, "ok": True,
                             "problem": ""}],
            "report": {"kind": "gate", "gate": 4, "gate_name": "Production fit",
                       "gate_name_zh": "生产适配", "pilot_name": pilot.name,
                       "pilot_code": str(pilot.code), "customer": pilot.customer.name, "code": str(report.code),
                       "verdict": "pass", "simulated": True}}


def test_every_portal_page_in_chinese_leaves_no_english_sentence(signed_pilot, client):
    world = signed_pilot
    pilot = world.pilot
    for person in (world.alice, world.bob, world.carol, world.charlie):
        Profile.objects.update_or_create(user=person, defaults={"language": "zh-hans"})
    client.cookies.load({settings.LANGUAGE_COOKIE_NAME: "zh-hans"})
    data = _names(world)
    found: dict[str, list[str]] = {}

    def read(name, url, *, who=None, status=200, method="get", **post):
        if who is not None:
            client.force_login(who)
        response = client.post(url, post, follow=True) if method == "post" else client.get(url)
        assert response.status_code == status, f"{name}: {url} answered {response.status_code}"
        html = response.content.decode()
        assert 'lang="zh-hans"' in html or "lang=\"zh-Hans\"" in html, f"{name} is not in Chinese"
        sentences = page_sentences(html, data)
        if sentences:
            found[name] = sorted(set(sentences))
        return html

    code = pilot.code
    # Logged out: the login page.
    read("login", reverse("login"))
    # The plan and G1 while the plan is open (the demo pilot is signed here: the plan page shows its signatures).
    read("home", reverse("home"), who=world.alice)
    read("new pilot", reverse("pilot_new"))
    read("plan", reverse("plan", args=[code]))
    read("overview (G1 open)", reverse("pilot", args=[code]))
    read("G1 open", reverse("gate", args=[code, 1]))
    site, _credential, node = add_lab(world, "SHA256:zhFingerprint")
    read("sites", reverse("sites", args=[code]))
    read("node waiting for its host key", reverse("node", args=[node.code]))
    read("403", reverse("pilot_new"), who=world.carol, status=403)
    read("404", reverse("pilot", args=[code]), who=world.charlie, status=404)

    pilot.signed_people = (world.alice, world.bob)
    _walk_to(pilot, 4)
    read("G4 before its trace", reverse("gate", args=[code, 4]), who=world.carol)
    upload = SimpleUploadedFile("ours.csv", CUSTOMER_TRACE)
    read("G4 trace uploaded", reverse("gate_trace", args=[code, 4]), method="post", trace=upload)
    bad = SimpleUploadedFile("ours.csv", b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,x,1,0\n")
    read("G4 trace refused", reverse("gate_trace", args=[code, 4]), method="post", trace=bad)
    assert run_trace_jobs() == ["ready", "refused"]     # what the worker does after each upload
    refused_page = read("trace page", reverse("pilot_traces", args=[code]))
    assert "第 2 行，prompt_tokens 列：&#x27;x&#x27; 不是整数" in refused_page  # the client's error, in Chinese
    read("overview with the trace", reverse("pilot", args=[code]))

    g4 = _evaluate(pilot, 4)
    job = g4.job
    job.site, job.created_by, job.status, job.started, job.finished = (site, world.alice, Status.SUCCESSFUL,
                                                                       timezone.now(), timezone.now())
    job.save()
    for seq, name in enumerate(("preflight", "deploy", "measure", "evaluate"), start=1):
        Step.objects.create(job=job, seq=seq, name=name, node=node if seq < 4 else None, status=Status.SUCCESSFUL)
    output.system_line(job, "G4 run created by Alice Chen")
    lifecycle.record_verdict(pilot.gate(4), g4, who="test")
    for number in (1, 2, 3):
        read(f"G{number} signed off", reverse("gate", args=[code, number]), who=world.alice)
    read("G4 awaiting sign-off (vendor)", reverse("gate", args=[code, 4]))
    read("G4 run", reverse("run", args=[job.code]))
    read("G4 signed by the vendor", reverse("gate_signoff", args=[code, 4]), method="post", decision="approve",
         comment="")
    read("G4 awaiting sign-off (customer)", reverse("gate", args=[code, 4]), who=world.bob)
    lifecycle.sign_off_gate(pilot.gate(4), world.bob, decision="approve")
    pilot.refresh_from_db()
    assert pilot.state == "completed"

    first = _fake_report(pilot, pilot.gate(4), g4, Report.Kind.GATE)
    final = _fake_report(pilot, pilot.gate(4), g4, Report.Kind.GATE, supersedes=first, by=world.bob)
    procurement = _fake_report(pilot, None, None, Report.Kind.PROCUREMENT)
    _fake_report(pilot, None, None, Report.Kind.PROCUREMENT, supersedes=procurement, by=world.bob)
    read("home (completed)", reverse("home"))
    read("overview (completed)", reverse("pilot", args=[code]))
    read("plan (signed)", reverse("plan", args=[code]))
    read("G4 signed off", reverse("gate", args=[code, 4]))
    read("reports", reverse("reports", args=[code]))
    from gates.models import ReportJob

    for state in (ReportJob.State.QUEUED, ReportJob.State.STALE, ReportJob.State.DONE):
        job_row = ReportJob.objects.create(kind=ReportJob.Kind.COUNTERSIGN, pilot=pilot, report_kind=Report.Kind.GATE,
                                           gate=pilot.gate(4), evaluation=g4, source=first, sha256=first.sha256,
                                           requested_by=world.bob, state=state,
                                           result=None if state == ReportJob.State.QUEUED else final,
                                           error="version 2 was made after it",
                                           reason={"template": "version %(number)s (%(code)s) was made after it",
                                                   "values": {"number": "2", "code": str(final.code)}})
        page = read(f"report job ({state})", reverse("report_job", args=[job_row.code]))
        if state == ReportJob.State.STALE:  # why, in Chinese too (it was shown on English pages only)
            assert 'id="report-job-reason"' in page and str(final.code) in page
    assert "关卡已签核" in read("audit", reverse("audit", args=[code]))  # the action in words, its code beside it
    read("verify", reverse("report_verify"))
    read("check a stored report", reverse("report_check", args=[final.code]))
    done = UploadVerification.objects.create(requested_by=world.bob, filename="g4.pdf", sha256="0" * 64, path="none",
                                             state=UploadVerification.State.DONE, result=_verified(pilot, final),
                                             finished=timezone.now())
    assert "生产适配" in read("verify result", reverse("report_verification", args=[done.code]))
    refused = UploadVerification.objects.create(
        requested_by=world.bob, filename="other.pdf", sha256="0" * 64, path="none",
        state=UploadVerification.State.DONE, finished=timezone.now(),
        result=_refused())
    page = read("verify result (not verified)", reverse("report_verification", args=[refused.code]))
    assert "此 PDF 没有附件" in page and "已签名的字节被改动（摘要不一致）" in page and "清单中列出但未附带" in page

    assert not found, "\n".join(f"{name}: {sentences}" for name, sentences in found.items())


def test_the_detector_finds_english_and_lets_names_units_and_codes_pass():
    assert page_sentences("<p>关卡 <b>Signed off</b></p>") == ["Signed off"]
    assert page_sentences('<p title="Start the run">开始</p>') == ["Start the run"]
    assert page_sentences("<p>复制 <code>python manage.py worker --queues lab</code></p>") == []
    assert page_sentences("<p>vLLM + LMCache 在 FX100 上，MI308X 经 SSH，TTFT p99 12.0 ms，ours.csv</p>") == []
    assert page_sentences("<p>试点 Example Cloud 3f2a9c1e</p>", ["Example Cloud"]) == []
    assert page_sentences("<script>var a = 'Not translated here';</script>") == []


def test_notifications_made_before_a_person_chose_chinese_read_in_chinese_after(signed_pilot, client):
    from portal import notifications

    world = signed_pilot
    add_lab(world, "SHA256:beforeSwitching")  # alice, who has not chosen a language yet, must accept its host key
    notifications.sweep([world.pilot])
    client.force_login(world.alice)
    assert "accept the host key of node1" in client.get(reverse("home")).content.decode()
    client.post(reverse("set_language"), {"language": "zh-hans", "next": reverse("home")})
    home = client.get(reverse("home")).content.decode()
    assert "接受 node1 的主机密钥" in home and "accept the host key" not in home
    assert not page_sentences(home, _names(world)), page_sentences(home, _names(world))
