"""The SVG charts: well-formed, one series per arm, labels escaped, a CJK font in the stack, log scale when needed."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from django.utils import translation

from reports.charts import Point, by_concurrency, cdf_chart, gate_charts, line_chart, parse_distribution_key
from tests.reports.verdicts import table1_verdict

SVG = "{http://www.w3.org/2000/svg}"


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def test_a_g3_verdict_gives_ttft_throughput_and_one_distribution_per_concurrency():
    charts = gate_charts(table1_verdict())
    assert [c.key for c in charts] == ["ttft-p50-measure", "throughput-measure", "ttft-cdf-8", "ttft-cdf-16", "ttft-cdf-32"]
    for chart in charts:
        root = _parse(chart.svg)
        assert "Noto Sans CJK SC" in root.get("font-family")


def test_each_arm_is_one_line_with_the_median_of_its_repetitions():
    metrics = [{"arm": "fx", "phase": "measure", "concurrency": c, "repetition": r, "ttft_p50": v}
               for c, values in ((8, [7.0, 8.0, 9.0]), (16, [11.0, 12.0, 13.0])) for r, v in enumerate(values, 1)]
    series = by_concurrency(metrics, "ttft_p50")
    assert series == {"fx": [Point(8, 8.0, 7.0, 9.0), Point(16, 12.0, 11.0, 13.0)]}
    root = _parse(line_chart(series, title="t", x_label="x", y_label="y"))
    assert len(root.findall(f"{SVG}polyline")) == 1 and len(root.findall(f"{SVG}circle")) == 2


def test_recompute_next_to_fx_switches_the_axis_to_a_log_scale():
    svg = line_chart({"fx": [Point(16, 11.85)], "recompute": [Point(16, 149.48)]}, title="t", x_label="x", y_label="TTFT",
                     log_note=" (log)")
    assert "TTFT (log)" in svg
    assert "(log)" not in line_chart({"fx": [Point(8, 7.5), Point(16, 11.85)]}, title="t", x_label="x", y_label="TTFT")


def test_labels_are_escaped():
    svg = cdf_chart({"<arm>&": [1.0, 2.0, 3.0]}, title="a < b & c", x_label="x", y_label="y")
    root = _parse(svg)
    assert "a < b & c" in [t.text for t in root.iter(f"{SVG}text")]


def test_titles_follow_the_active_language():
    with translation.override("zh-hans"):
        charts = gate_charts(table1_verdict())
    with translation.override("en"):
        english = gate_charts(table1_verdict())
    assert charts[0].title != english[0].title and english[0].title == "TTFT p50 by concurrency"


def test_distribution_keys_name_arm_concurrency_and_phase():
    assert parse_distribution_key("fx@8") == ("fx", 8, "")
    assert parse_distribution_key("recompute@8/replay") == ("recompute", 8, "replay")


def test_an_empty_verdict_has_no_charts():
    assert gate_charts({}) == []


def test_the_soak_chart_draws_the_drift_criterions_own_statistic_and_bar_without_the_warm_up():
    from gates.judge import synthetic, verdicts
    from gates.plan import load_plan
    from reports.charts import soak_series

    verdict = verdicts.evaluate(load_plan(), 4, synthetic.gate_inputs(4))
    criterion = next(c for c in verdict["criteria"] if c["comparison"] == "drift")
    cell = next(c for c in criterion["cells"] if c.get("per_window"))
    series, bars, warmup = soak_series(verdict)
    judged, context = series.values()
    assert warmup == cell["warmup_windows"] >= 1
    # The judged line starts after the warm-up and carries the statistic the judge used, window by window.
    assert [p.x for p in judged] == [float(w) for w in cell["early_windows"] + cell["late_windows"]]
    assert min(p.x for p in judged) > warmup and [p.y for p in judged] == cell["per_window"]
    assert list(series)[0].startswith(cell["statistic_used"])
    # The bar: the early steady windows' level × (1 + bar), over the late windows — not the first window's p50.
    (label, points), = bars
    assert {p.y for p in points} == {cell["first_value"] * (1 + criterion["threshold"])}
    assert [p.x for p in points] == [float(w) for w in cell["late_windows"]]
    assert len(context) == cell["windows"]  # every window, warm-up included, for context
