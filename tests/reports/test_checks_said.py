"""Validity details are kept as the judge made them (catalogue sentences and values beside the English): said in
Chinese without reading the English back; a verdict stored before them shows its English detail."""

from __future__ import annotations

import json
import re

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


ENGLISH_RUN = re.compile(r"\b(?:[A-Za-z]{3,}\s+){3,}[A-Za-z]{3,}\b")  # four English words in a row


def _said_whole(verdict: dict) -> list[dict]:
    """Every check of the verdict carries its sentences, and they are its English detail."""
    checks = verdict["validity"]["checks"]
    for check in checks:
        assert "detail_said" in check or not check["detail"], check
        if check["detail"]:
            assert "; ".join(validity.english(part) for part in check["detail_said"]) == check["detail"], check
    return checks


def test_failed_checks_are_said_in_chinese_too_not_only_the_passing_ones():
    from gates.judge import evaluate, synthetic
    from gates.plan import load_plan
    from tests.judge.helpers import plan_with

    plan = load_plan("default")
    frame = synthetic.table1_frame(seed=5)
    copy = frame[frame["arm"] == "fx"].assign(run_id="another-run")
    real = frame[frame["arm"] == "local_nvme"].assign(simulated=False, run_id="real")
    files = [("records.jsonl", synthetic.jsonl(synthetic.records(frame))),
             ("records.summary.json", synthetic.jsonl(synthetic.phase_summaries(frame))),
             ("copy.jsonl", synthetic.jsonl(synthetic.records(copy))),
             ("real.jsonl", synthetic.jsonl(synthetic.records(real))),
             ("node1/inventory.json", json.dumps(synthetic.inventory()).encode())]
    g3 = evaluate(plan, 3, files)
    inventory = synthetic.inventory("node1", gpus={"count": 8, "model": "MI308X"},
                                    nics=[{"name": "ens1f0np0", "state": "up", "speed_gbps": 100,
                                           "rdma_device": "mlx5_0", "rdma_state": None}])
    g1_plan = plan_with([{"key": "model", "metric": "gpu_model_match", "statistic": "min", "comparison": "absolute",
                          "threshold": 1},
                         {"key": "link", "metric": "link_speed_gbps", "statistic": "min", "comparison": "absolute",
                          "threshold": 100}], gate=1)
    g1 = evaluate(g1_plan, 1, [("node1/inventory.json", json.dumps(inventory).encode())])
    failed = [c for c in _said_whole(g3) + _said_whole(g1) if not c["ok"]]
    names = {c["name"] for c in failed}
    assert {"no-duplicate-requests", "no-simulated-mixed-with-real", "inventory-complete"} <= names, names
    with translation.override("zh-hans"):
        shown = localised({"checks": failed})["checks"]
    for check in shown:
        english = ENGLISH_RUN.findall(check["detail_text"])
        assert not english, (check["name"], check["detail_text"])
