"""Properties: record order never matters; a stricter bar never improves a verdict."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gates.judge import canonical_json, evaluate, synthetic
from gates.judge.verdicts import SEVERITY
from gates.plan import Plan, load_plan

PLAN = load_plan("default")
FRAME = synthetic.table1_frame(seed=3, requests_per_cell=8, noise=0.2)
RECORDS = synthetic.records(FRAME)
OTHERS = [("records.summary.json", synthetic.jsonl(synthetic.phase_summaries(FRAME))),
          ("node1/inventory.json", synthetic.jsonl([synthetic.inventory()]))]


def without_digests(verdict: dict) -> str:
    """The verdict apart from its input hashes (a shuffled file has other bytes, so another SHA-256)."""
    return canonical_json({key: value for key, value in verdict.items() if key != "inputs"})


BASELINE = without_digests(evaluate(PLAN, 3, [("records.jsonl", synthetic.jsonl(RECORDS)), *OTHERS]))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.permutations(range(len(RECORDS))))
def test_permuting_records_changes_nothing(order):
    shuffled = [RECORDS[i] for i in order]
    verdict = evaluate(PLAN, 3, [("records.jsonl", synthetic.jsonl(shuffled)), *OTHERS])
    assert without_digests(verdict) == BASELINE


def with_threshold(plan: Plan, gate: int, index: int, threshold: float) -> Plan:
    gates = []
    for g in plan.gates:
        if g.number == gate:
            criteria = list(g.criteria)
            criteria[index] = dataclasses.replace(criteria[index], threshold=threshold)
            g = dataclasses.replace(g, criteria=tuple(criteria))
        gates.append(g)
    return dataclasses.replace(plan, gates=tuple(gates))


FILES = [("records.jsonl", synthetic.jsonl(RECORDS)), *OTHERS]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index=st.integers(0, 3), low=st.floats(-0.5, 15.0), step=st.floats(0.0, 5.0))
def test_a_stricter_threshold_never_improves_a_verdict(index, low, step):
    criterion = PLAN.gate(3).criteria[index]
    # stricter means a higher bar for ≥ and a lower one for ≤
    lenient, strict = (low, low + step) if criterion.op in (">=", ">") else (low + step, low)
    if criterion.metric == "error_rate" and criterion.statistic == "count":
        lenient, strict = lenient / 10, strict / 10
    elif criterion.metric == "error_rate":  # a rate bar: positive (a bar of 0 is read as an observed count)
        lenient, strict = 0.0005 + abs(lenient) / 1000, 0.0005 + abs(strict) / 1000
        lenient, strict = max(lenient, strict), min(lenient, strict)
    a = evaluate(with_threshold(PLAN, 3, index, lenient), 3, FILES)
    b = evaluate(with_threshold(PLAN, 3, index, strict), 3, FILES)
    assert SEVERITY[b["criteria"][index]["verdict"]] >= SEVERITY[a["criteria"][index]["verdict"]]
    assert SEVERITY[b["verdict"]] >= SEVERITY[a["verdict"]]
    for cell_a, cell_b in zip(a["criteria"][index]["cells"], b["criteria"][index]["cells"], strict=True):
        assert SEVERITY[cell_b["verdict"]] >= SEVERITY[cell_a["verdict"]]


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.floats(0.01, 1000.0), min_size=2, max_size=12), level=st.floats(0.5, 0.99))
def test_the_intervals_do_not_depend_on_the_order_of_repetitions(values, level):
    from gates.judge import intervals

    for method in (intervals.log_t, intervals.linear_t, intervals.cv_chi2):
        a = method(np.array(values), level)
        b = method(np.array(list(reversed(values))), level)
        assert np.allclose(np.array(a, dtype=float), np.array(b, dtype=float), equal_nan=True)
        assert not a[1] > a[0] * (1 + 1e-9) + 1e-12 or np.isnan(a[1])  # the point is inside its interval


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(allow_nan=True)
                           | st.text(max_size=5), lambda inner: st.lists(inner, max_size=2), max_leaves=3)


@settings(max_examples=150, deadline=None)
@given(line=st.integers(0, 9), field=st.sampled_from(sorted(RECORDS[0]) + ["extra"]), value=JSON_VALUES,
       drop=st.booleans())
def test_any_damaged_record_is_either_read_or_refused_with_its_line(line, field, value, drop):
    from gates.judge import RecordError, load_inputs

    records = [dict(r) for r in RECORDS[:10]]
    if drop:
        records[line].pop(field, None)
    else:
        records[line][field] = value
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    try:
        load_inputs([("r.jsonl", data)])
    except RecordError as error:
        assert error.source == "r.jsonl" and error.line == line + 1
