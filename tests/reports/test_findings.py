"""The verifier's findings are kept as made (a catalogue sentence and its values): said in Chinese without reading
the English back, and in English exactly as the command line prints them."""

from __future__ import annotations

from django.utils import translation

from reports.findings import english, in_language
from reports.verify import verify_pdf


def test_a_refused_file_is_said_in_either_language_from_what_the_verifier_made():
    result = verify_pdf(b"%PDF-1.7\nnot really a PDF", [])
    assert not result.ok and len(result.findings) == len(result.reasons) >= 2
    assert [english(f) for f in result.findings] == result.reasons
    assert result.reasons[0].startswith("no trust root given")
    with translation.override("zh-hans"):
        chinese = [in_language(f) for f in result.findings]
    assert all(text not in result.reasons for text in chinese), chinese
    unreadable = result.findings[1]
    assert unreadable["template"] == "not a readable PDF: %(error)s"
    assert unreadable["values"]["error"] in chinese[1]  # the detail as it was, in the Chinese sentence


def test_an_attachment_problem_nests_its_own_finding():
    from reports.verify import AttachmentCheck, VerificationResult, _check_attachments

    result = VerificationResult(ok=False, reasons=[], signatures=[], attachments=[], report={}, metadata={})
    _check_attachments({"manifest.json": b'{"schema": "fxpilot.report-manifest/1", "artifacts": []}', "x.bin": b"1"},
                       result, result.findings)
    (check,) = result.attachments
    assert isinstance(check, AttachmentCheck) and check.problem == "attached but not listed in the manifest"
    assert english(result.findings[0]) == "attachment 'x.bin': attached but not listed in the manifest"
    with translation.override("zh-hans"):
        assert in_language(result.findings[0]) == "附件 'x.bin'：已附带但清单中未列出"
