"""Every report in Simplified Chinese: no English sentence is left untranslated (names and codes aside)."""
from __future__ import annotations

import re
import subprocess

from reports import service
from tests.reports.test_truth import _complete, walked  # noqa: F401 — the fixture

# Four or more English words in a row is a sentence a reader would have to translate.
ENGLISH = re.compile(r"[A-Za-z][a-z]+(?:[ ,'’-]{1,3}[A-Za-z][a-z]+){3,}")


def english_sentences(text: str, data: list[str]) -> list[str]:
    """English runs left after removing the data a person typed (names of pilots, organisations, people, signers)."""
    text = " ".join(text.split())
    for value in sorted(data, key=len, reverse=True):
        text = text.replace(value, " ")
    text = re.sub(r"[\w.+-]+/[\w./+-]+", " ", text)  # model ids and paths
    text = re.sub(r"\b[a-z0-9]+(?:[-_][a-z0-9]+)+\b", " ", text)  # identifiers: criterion keys, arms, settings
    return ENGLISH.findall(text)


def _data(pilot) -> list[str]:
    return [pilot.name, pilot.customer.name, pilot.vendor.name, "Bob Wang", "Alice Chen", "fxpilot evidence signer",
            "Organization: fxpilot, Common Name:", "python manage.py verify_report FILE",
            "pyhanko sign validate --trust root.pem --trust-replace FILE", "Adobe Acrobat"]


def _text(report) -> str:
    return subprocess.run(["pdftotext", str(service.report_path(report)), "-"], capture_output=True, text=True,
                          check=True).stdout


def test_the_chinese_reports_leave_no_english_sentence(walked):  # noqa: F811
    pilot = _complete(walked, sizing={"fx_unit_usable_tb": 30.72})
    procurement = service.create_procurement_report(pilot, language="zh-hans")
    g3 = service.create_gate_report(pilot.gate(3), language="zh-hans")
    g4 = service.create_gate_report(pilot.gate(4), language="zh-hans")
    for report in (procurement, g3, g4):
        found = english_sentences(_text(report), _data(pilot))
        assert not found, f"{report.kind} {report.gate}: {found[:20]}"
        fonts = subprocess.run(["pdffonts", str(service.report_path(report))], capture_output=True, text=True,
                               check=True).stdout
        assert "CJK-SC" in fonts.replace(" ", "-") and not re.search(r"CJK[- ]?(JP|KR|TC|HK)", fonts), fonts


def test_the_detector_finds_an_english_sentence_and_ignores_names_and_codes():
    assert english_sentences("关卡报告 The report was made here。", []) == ["The report was made here"]
    assert english_sentences("试点 FX100 joint test — Example Cloud g3-ttft-vs-local Qwen/Qwen3-Coder-480B",
                             ["FX100 joint test — Example Cloud"]) == []
