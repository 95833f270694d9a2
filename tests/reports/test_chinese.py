"""A report in Simplified Chinese embeds a CJK font, extracts as Chinese text and has a glyph for every character."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from django.conf import settings
from fontTools.ttLib import TTCollection

from reports import render, sign
from tests.reports.verdicts import gate_context, table1_verdict


def _cjk_font_cmap() -> set[int]:
    path = subprocess.run(["fc-match", "-f", "%{file}", "Noto Sans CJK SC"], capture_output=True, text=True).stdout
    if "NotoSansCJK" not in path:
        pytest.fail("Noto Sans CJK SC is not installed: scripts/system-packages fonts-noto-cjk")
    for font in TTCollection(path).fonts:
        if font["name"].getDebugName(1) == "Noto Sans CJK SC":
            return set(font.getBestCmap())
    raise AssertionError(f"{path} holds no Noto Sans CJK SC face")


@pytest.fixture(scope="module")
def chinese_pdf(tmp_path_factory, vendor_signer) -> Path:
    pdf = render.render_pdf(gate_context(table1_verdict()), "zh-hans")
    path = tmp_path_factory.mktemp("zh") / "g3-zh.pdf"
    path.write_bytes(sign.sign_pdf(pdf, vendor_signer, field_name=sign.VENDOR_FIELD, reason="test", certify=True))
    return path


def test_the_cjk_font_is_embedded_and_nothing_is_left_unembedded(chinese_pdf):
    fonts = subprocess.run(["pdffonts", str(chinese_pdf)], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in fonts.splitlines()[2:] if line.strip()]
    assert any("Noto-Sans-CJK-SC" in row[0] for row in rows), fonts
    assert all(row[-5] == "yes" for row in rows), fonts  # the "emb" column


def test_the_text_extracts_as_chinese(chinese_pdf):
    text = subprocess.run(["pdftotext", str(chinese_pdf), "-"], capture_output=True, text=True, check=True).stdout
    for phrase in ("关卡报告 G3", "性能", "模拟 — 非证据", "公开发布的收益在本集群上成立", "有效性检查", "环境清单", "证据清单"):
        assert phrase in text, phrase


def test_every_chinese_character_of_the_report_has_a_glyph(chinese_pdf):
    """The whole zh catalogue and the plan's Chinese texts are covered by the first font of the zh stack."""
    cmap = _cjk_font_cmap()
    catalogue = (Path(settings.BASE_DIR) / "locale/zh_Hans/LC_MESSAGES/django.po").read_text(encoding="utf-8")
    texts = re.findall(r'^msgstr "(.*)"$', catalogue, re.M)
    texts += [(Path(settings.BASE_DIR) / "gates/plans/default.yaml").read_text(encoding="utf-8")]
    texts += [subprocess.run(["pdftotext", str(chinese_pdf), "-"], capture_output=True, text=True).stdout]
    missing = {ch for text in texts for ch in text if ord(ch) > 0x2E7F and ord(ch) not in cmap}
    assert not missing, "".join(sorted(missing))


def test_a_page_renders_to_png(chinese_pdf, tmp_path):
    subprocess.run(["pdftoppm", "-r", "40", "-f", "1", "-l", "1", "-png", str(chinese_pdf), str(tmp_path / "page")], check=True)
    [png] = list(tmp_path.glob("page*.png"))
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 5000
