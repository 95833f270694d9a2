"""Reports fetch nothing from outside: hostile names, comments and inventory strings reach the PDF as
text, and a local listener sees no request while a report is made (it does see one from WeasyPrint's
own fetcher, so it would notice)."""
from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest
from django.conf import settings
from weasyprint import HTML

from gates.judge import synthetic, verdicts
from gates.models import Evaluation, Party, Role, SignOff
from gates.plan import load_plan
from reports import service
from reports.render import StaticOnlyFetcher, clean_text, css_string
from runners.artifacts import store_bytes
from runners.models import Job


@pytest.fixture
def listener():
    """An HTTP server on an ephemeral loopback port that records every request it gets."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/css")
            self.end_headers()
            self.wfile.write(b"body { color: red }")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def hostile(base: str, where: str) -> str:
    # NUL is left out: PostgreSQL refuses it in text (and Django's forms refuse it); clean_text's test has it.
    return (f'{where}"; }} @import url({base}/{where}-import.css); @page {{ background: url({base}/{where}-bg) }} '
            f'\\22 \\A \r\f\x01\x1b\x0b\u202e <img src="{base}/{where}-img"> <link rel=stylesheet href="{base}/{where}.css">'
            f"</style><style>@import '{base}/{where}-style';</style>")


def test_the_listener_notices_a_fetch_when_weasyprint_is_left_to_itself(listener):
    base, seen = listener
    HTML(string=f'<img src="{base}/control">').write_pdf()
    assert seen == ["/control"]


def test_the_report_fetcher_serves_static_files_and_data_urls_and_refuses_the_rest(listener, tmp_path):
    base, seen = listener
    fetcher = StaticOnlyFetcher()
    css = Path(settings.BASE_DIR) / "static" / "fxpilot" / "portal.css"
    assert fetcher.fetch(css.as_uri()).read() == css.read_bytes()
    assert fetcher.fetch("data:text/plain,hello").read() == b"hello"
    secret = tmp_path / "secret.txt"
    secret.write_text("not for reports")
    for url in (f"{base}/x", "https://example.com/x", secret.as_uri(), "file:///etc/passwd", "ftp://127.0.0.1/x",
                (css.parent / ".." / ".." / "fxpilot" / "settings.py").as_uri(), "gopher://127.0.0.1/"):
        with pytest.raises(ValueError, match="refused"):
            fetcher.fetch(url)
    assert seen == [] and len(fetcher.refused) == 7


def test_css_strings_cannot_be_closed_by_a_value():
    text = str(css_string('a"b\\c\n<\u00a0/style>; } @import url(x) 中文\f\r'))
    inner = text[1:-1]
    assert '"' not in inner and "\\c" not in inner and "<" not in inner and "\n" not in inner and "\f" not in inner
    assert "中文" in inner and inner.count("\\") == text.count("\\")
    assert clean_text("a\x00b\fc\u202ed\te\nf") == "a\ufffdb\ufffdc\ufffdd\te\nf"


def test_a_report_for_hostile_names_comments_and_inventory_fetches_nothing(signed_pilot, listener):
    base, seen = listener
    pilot = signed_pilot.pilot
    pilot.name = hostile(base, "pilot")[:200]
    pilot.save(update_fields=["name"])
    pilot.customer.name = hostile(base, "customer")[:200]
    pilot.customer.save()
    gate = pilot.gate(3)
    files = synthetic.gate_inputs(3)
    job = Job.objects.create(pilot=pilot, gate=gate)
    for name, data in files:
        store_bytes(job, name, data, kind="records" if name.endswith(".jsonl") else "probe", simulated=True)
    result = verdicts.evaluate(load_plan(), 3, files)
    for item in result.get("inventory") or []:
        item["node"] = hostile(base, "node")
        for nic in item.get("nics") or []:
            nic["name"] = hostile(base, "nic")
    result["criteria"][0]["explanation"] = hostile(base, "explanation")
    result["criteria"][0]["description"] = hostile(base, "description")
    evaluation = Evaluation.objects.create(gate=gate, job=job, plan_version=pilot.signed_plan, verdict=result["verdict"],
                                           result=result, inputs=result["inputs"], simulated=True)
    SignOff.objects.create(pilot=pilot, gate=gate, evaluation=evaluation, party=Party.VENDOR, person=signed_pilot.alice,
                           role=Role.VENDOR_LEAD, decision="approve", comment=hostile(base, "comment"),
                           evidence_sha256="0" * 64)
    signed_pilot.alice.first_name = hostile(base, "person")[:120]  # the audit keeps full names in 150
    signed_pilot.alice.save()
    for language in ("en", "zh-hans"):
        report = service.create_gate_report(gate, evaluation, language=language, who=signed_pilot.alice)
        check = service.verify_report_bytes(service.report_path(report).read_bytes())
        assert check.ok, check.reasons
    assert seen == []
