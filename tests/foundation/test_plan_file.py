"""The plan file is validated whenever it is loaded; errors name the file, the gate and the field."""
from __future__ import annotations

import copy

import pytest
import yaml

from gates.plan import PLANS_DIR, PlanError, load_plan, validate_plan


@pytest.fixture
def plan_data() -> dict:
    return yaml.safe_load((PLANS_DIR / "default.yaml").read_text())


def _write(tmp_path, data) -> str:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True) if not isinstance(data, str) else data)
    return str(path)


def test_the_default_plan_loads_with_four_gates_and_the_published_bars():
    plan = load_plan("default")
    assert [g.label for g in plan.gates] == ["G1", "G2", "G3", "G4"]
    g3 = {c.key: c for c in plan.gate("G3").criteria}
    assert g3["g3-speedup-recompute"].threshold == 8.6 and g3["g3-speedup-recompute"].concurrency == (16,)
    assert g3["g3-ttft-vs-local"].comparison == "reduction" and g3["g3-ttft-vs-local"].concurrency == (8, 16, 32)
    assert len(plan.sha256) == 64 and plan.sha256 == load_plan("default").sha256


@pytest.mark.parametrize(
    ("mutate", "where", "words"),
    [
        (lambda d: d["gates"][2]["criteria"][0].update(metric="latency"), "G3 › criteria[1] › metric", "unknown metric 'latency'"),
        (lambda d: d["gates"][2]["criteria"][1].update(threshold="twenty"), "G3 › criteria[2] › threshold", "'twenty' is not a number"),
        (lambda d: d["gates"].pop(3), "gates", "missing G4"),
        (lambda d: d["gates"][3].update(number=3), "G3 › number", "two gates have the number 3"),
        (lambda d: d["gates"][1]["criteria"][0].update(op="=>"), "G2 › criteria[1] › op", "is not an operator"),
        (lambda d: d["gates"][2]["criteria"][1].pop("baseline"), "G3 › criteria[2] › baseline", "compares two arms"),
        (lambda d: d["gates"][0].update(weeks=[2, 1]), "G1 › weeks", "must be [first, last]"),
        (lambda d: d["gates"][1]["criteria"][1].update(key="g2-hit-ratio"), "G2 › criteria[2] › key", "used twice"),
        (lambda d: d["judging"].update(confidence=1.5), "judging › confidence", "below 1"),
        (lambda d: d.update(schema="fxpilot.plan/9"), "schema", "unknown schema"),
    ],
)
def test_a_bad_plan_file_names_the_file_the_gate_and_the_field(tmp_path, plan_data, mutate, where, words):
    data = copy.deepcopy(plan_data)
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(PlanError) as error:
        load_plan(path)
    assert error.value.source == path
    assert error.value.where == where
    assert words in error.value.message


def test_malformed_yaml_names_the_line(tmp_path):
    path = _write(tmp_path, "name: x\ngates: [\n  - number: 1\n")
    with pytest.raises(PlanError) as error:
        load_plan(path)
    assert "not valid YAML" in str(error.value) and "line" in error.value.where


def test_an_unknown_plan_name_lists_the_named_plans():
    with pytest.raises(PlanError) as error:
        load_plan("nonexistent")
    assert "default" in str(error.value)


def test_a_plan_that_is_not_a_mapping_is_refused():
    with pytest.raises(PlanError, match="mapping"):
        validate_plan(["gates"], source="x.yaml")
