"""The sample-size planner: what each criterion needs, the default plan follows it, a plan that cannot decide
is flagged, and `manage.py judge --power` prints it."""
from __future__ import annotations

import json
from io import StringIO

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from gates.judge import planner
from gates.plan import PLANS_DIR, load_plan, validate_plan

PLAN = load_plan("default")
SUMMARY = planner.summary(PLAN)
BY_KEY = {c["key"]: c for c in SUMMARY["criteria"]}


def plan_with_repetitions(reps: int):
    document = yaml.safe_load((PLANS_DIR / "default.yaml").read_text(encoding="utf-8"))
    document["workloads"]["cold_recovery"]["repetitions"] = reps
    document["judging"].pop("looks")  # the documented default looks of `reps` repetitions
    return validate_plan(document, source="test plan")


def test_the_default_plan_reaches_eighty_percent_power_on_the_published_figures():
    # G4's increment over DRAM has no published figure: at the plan's assumed 1.5× its 3 replay repetitions give
    # about 79 % against its 1.2× bar, and the planner says so rather than the plan hiding it
    assert SUMMARY["flagged"] == ["g4-replay-speedup"] and SUMMARY["spread"] == 0.06
    assert 0.7 <= BY_KEY["g4-replay-speedup"]["power_at_plan"] < 0.8
    for key in ("g3-speedup-recompute", "g3-ttft-vs-local", "g3-throughput-vs-local", "g1-baseline-stable",
                "g4-replay-speedup-recompute", "g4-soak-drift"):
        assert BY_KEY[key]["power_at_plan"] >= 0.78, BY_KEY[key]  # 0.8 less the planner's Monte Carlo error
    g3 = next(g for g in SUMMARY["gates"] if g["gate"] == 3)
    assert g3["planned_repetitions"] >= g3["repetitions_needed"] and g3["gpu_hours_planned"] > 0


def test_every_default_rate_bar_can_be_shown_with_the_requests_the_plan_sends():
    rates = [c for c in SUMMARY["criteria"] if c["kind"] == "rate"]
    assert rates and all(c["requests_planned"] >= c["requests_needed"] for c in rates)
    assert BY_KEY["g3-failures"]["kind"] == "rate" and BY_KEY["g2-no-failures"]["kind"] == "count"


def test_the_published_g3_figures_come_from_table_1():
    assert BY_KEY["g3-speedup-recompute"]["published"] == {"16": pytest.approx(149.48 / 11.85)}
    assert BY_KEY["g3-ttft-vs-local"]["published"]["8"] == pytest.approx(1 - 7.53 / 10.17)


def test_three_repetitions_are_flagged_and_one_flags_every_spread_criterion():
    three = planner.summary(plan_with_repetitions(3))
    assert {"g3-ttft-vs-local", "g3-throughput-vs-local", "g1-baseline-stable"} <= set(three["flagged"])
    one = planner.summary(plan_with_repetitions(1))
    assert {"g1-baseline-ttft", "g1-baseline-stable", "g3-speedup-recompute"} <= set(one["flagged"])


def test_a_measured_spread_changes_what_is_needed():
    tight = planner.summary(PLAN, spread=0.01)
    assert tight["spread_source"] == "given"
    spread_based = [c for c in tight["criteria"] if c["gate"] == 3 and c["kind"] == "comparison"]
    assert spread_based and all(c["repetitions_needed"] <= 4 for c in spread_based)
    wide = planner.summary(PLAN, spread=0.10)
    assert all(w["repetitions_needed"] is None or w["repetitions_needed"] > t["repetitions_needed"]
               for w, t in zip((c for c in wide["criteria"] if c["gate"] == 3 and c["kind"] == "comparison"),
                               spread_based, strict=True))
    # the rate bar's repetitions do not depend on the spread: the error-free requests that show ≤ 1 % at the last
    # look's level (the first run's 2 % of α spent over five looks), 56 FX requests a repetition
    from gates.judge import intervals, sequential
    level = sequential.nominal_levels((8, 12, 16, 20, 24), 0.02)[-1]
    needed = intervals.error_free_needed(0.01, level)
    rate = next(c for c in tight["criteria"] if c["key"] == "g3-failures")
    assert rate["requests_needed"] == needed == 409 and rate["repetitions_needed"] == -(-needed // 56) == 8
    assert next(g for g in tight["gates"] if g["gate"] == 3)["repetitions_needed"] == 8


def test_the_figures_of_a_plan_and_spread_are_computed_once_and_a_changed_copy_changes_nothing():
    planner._SUMMARIES.clear()
    first = planner.summary(PLAN, spread=0.03)
    assert list(planner._SUMMARIES) == [(PLAN.sha256, 0.03)]
    first["criteria"][0]["key"] = "changed by a caller"
    first["gates"].clear()
    again = planner.summary(PLAN, spread=0.03)
    assert again == planner._summary(PLAN, spread=0.03) and again["gates"]
    # another spread, or another plan's content, is another entry
    document = yaml.safe_load((PLANS_DIR / "default.yaml").read_text(encoding="utf-8"))
    document.setdefault("planning", {})["power"] = 0.8
    other = validate_plan(document, source="test plan")
    assert planner.summary(other, spread=0.03)["power"] == 0.8
    assert planner.summary(PLAN, spread=None)["spread_source"] != "given"
    assert len(planner._SUMMARIES) == 3


def test_the_command_prints_the_planner():
    out = StringIO()
    call_command("judge", "--plan", "default", "--power", "--format", "table", stdout=out)
    assert "g3-ttft-vs-local" in out.getvalue() and "GPU-h" in out.getvalue()
    out = StringIO()
    call_command("judge", "--plan", "default", "--power", "--spread", "0.03", stdout=out)
    assert json.loads(out.getvalue())["spread"] == 0.03
    with pytest.raises(CommandError, match="between 0 and 1"):
        call_command("judge", "--plan", "default", "--power", "--spread", "6")


def test_the_soak_is_sized_for_its_drift_by_requests_per_window_and_windows():
    """Issue 45: each window's real request count is simulated (every window's quantile and its own sampling error,
    judged as the judge does); no drift passes and a 30 % drift fails, each with ≥ 95 %, at the plan's figures."""
    drift = BY_KEY["g4-soak-drift"]
    design = drift["drift"]
    assert drift["kind"] == "drift" and design["windows"] == 24 and design["warmup"] == 1
    assert design["requests_per_window_needed"] == 200 and drift["requests_needed"] == 200
    assert design["power_no_drift"] >= 0.95 and design["power_detect"] >= 0.95
    # the soak's floor: the rate bar's 3,911 error-free requests, or 24 windows × 200 for the drift, the larger
    assert planner.soak_requests_needed(PLAN) == 24 * 200
    spec = next(c for c in PLAN.gate(4).criteria if c.key == "g4-soak-drift")
    import numpy as np
    few = planner.drift_power(spec, 24, 1, 0.02, 0.95, np.random.default_rng(1), requests_per_window=50, drift=0.3)
    many = planner.drift_power(spec, 24, 1, 0.02, 0.95, np.random.default_rng(1), requests_per_window=800, drift=0.3)
    assert few < 0.8 < 0.95 < many     # more requests per window detect the same drift more often
    assert planner.drift_power(spec, 24, 1, 0.02, 0.95, np.random.default_rng(1), requests_per_window=30) == 0.0


def test_the_planners_order_statistics_match_sorting_every_request():
    import numpy as np
    rng = np.random.default_rng(7)
    drawn = planner._order_statistics(rng, (20000,), 100, [3, 90, 98])
    brute = np.sort(np.random.default_rng(8).standard_normal((20000, 100)), axis=1)[:, [2, 89, 97]]
    for got, want in zip(drawn, brute.T, strict=True):
        assert abs(got.mean() - want.mean()) < 0.03 and abs(got.std() - want.std()) < 0.03
