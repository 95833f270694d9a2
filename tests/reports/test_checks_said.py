"""Validity details are kept as the judge made them (catalogue sentences and values beside the English): said in
Chinese without reading the English back; a verdict stored before them shows its English detail."""

from __future__ import annotations

import pandas as pd
from django.utils import translation

from gates.judge import validity
from reports.checks import localised


def _clocks(offset: float) -> dict:
    return validity.clocks(pd.DataFrame({"wall_anchor": [], "phase": [], "instance": []}),
                           [{"clock_offset_s": offset, "instance": "n1:8000"}], 2.0)


def test_a_check_keeps_its_sentences_and_its_english_detail_is_them_joined():
    check = _clocks(0.5)
    assert check["ok"] and check["detail"] == "clocks agree within 2 s (1 comparison(s))"
    assert [validity.english(part) for part in check["detail_said"]] == [check["detail"]]
    bad = _clocks(-3.25)
    assert not bad["ok"] and bad["detail"] == ("instance n1:8000: its clock is -3.25 s from the collector's "
                                               "(tolerance 2 s)")


def test_the_checks_are_said_in_chinese_from_what_the_judge_made_and_old_verdicts_fall_back():
    stored = {"name": "clocks-agree", "ok": True, "detail": "clocks agree within 2 s (1 comparison(s))"}
    with translation.override("zh-hans"):
        made = localised({"checks": [_clocks(0.5), _clocks(-3.25)]})["checks"]
        old = localised({"checks": [stored]})["checks"][0]
    assert made[0]["detail_text"] == "时钟在 2 秒内一致（1 次比较）"
    assert "-3.25" in made[1]["detail_text"] and "n1:8000" in made[1]["detail_text"]
    assert "its clock" not in made[1]["detail_text"] and made[1]["title"] == "各实例的时钟一致"
    assert old["detail_text"] == stored["detail"]  # stored before detail_said: the English as it was
