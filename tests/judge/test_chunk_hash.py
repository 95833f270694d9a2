"""G4's sharing test believes a hit on instance B only if every instance hashed chunks alike: the deploy manifest's
chunk_hash (LMCache's pre_caching_hash_algorithm and the PYTHONHASHSEED the server ran with), carried in the phase
summaries' versions, must be one deterministic value on every real instance (issue 26)."""
from __future__ import annotations

import json

from gates.judge import evaluate, synthetic
from gates.plan import load_plan

PLAN = load_plan("default")


def g4_real(change=None) -> list[tuple[str, bytes]]:
    """The default plan's G4 inputs from real nodes, the share summaries changed by `change(summary)`; the share
    summary also as instance B's (only this check is read here: records for B are not made up)."""
    out = []
    for name, data in synthetic.gate_inputs(4, simulated=False):
        if name.endswith(".summary.json"):
            rows = [json.loads(line) for line in data.decode().splitlines()]
            shares = [row for row in rows if row["phase"] == "share"]
            for row in rows:
                row["instance"] = "node1:8002"
            for share in shares:
                rows.append({**json.loads(json.dumps(share)), "instance": "node2:8002"})
            for row in rows:
                if row["phase"] == "share" and change is not None:
                    change(row)
            data = synthetic.jsonl(rows)
        out.append((name, data))
    return out


def check(verdict: dict) -> dict:
    return next(c for c in verdict["validity"]["checks"] if c["name"] == "chunk-hash-shared")


def test_one_seeded_hash_on_every_instance_is_accepted():
    found = check(evaluate(PLAN, 4, g4_real()))
    assert found["ok"] and found["detail"].startswith("every instance ran sha256_cbor with PYTHONHASHSEED=0; every "
                                                      "process observed NONE_HASH "), found


def test_an_instance_without_a_seed_makes_the_run_invalid_naming_it():
    def unseeded(summary):
        if summary["instance"] == "node2:8002":
            summary["versions"]["chunk_hash"] = {"algorithm": "sha256_cbor", "pythonhashseed": None}
    verdict = evaluate(PLAN, 4, g4_real(unseeded))
    found = check(verdict)
    assert verdict["verdict"] == "invalid" and not found["ok"]
    assert ("fx share on node2:8002: sha256_cbor without a fixed PYTHONHASHSEED hashes differently in every process"
            in found["detail"]), found


def test_instances_that_hash_differently_are_named():
    def other_seed(summary):
        if summary["instance"] == "node2:8002":
            summary["versions"]["chunk_hash"] = {"algorithm": "sha256", "pythonhashseed": "0"}
    found = check(evaluate(PLAN, 4, g4_real(other_seed)))
    assert not found["ok"] and found["detail"].startswith("the instances hash differently: ")
    assert "sha256 with PYTHONHASHSEED=0 (fx share on node2:8002)" in found["detail"]
    assert "sha256_cbor with PYTHONHASHSEED=0 (fx share on node1:8002)" in found["detail"]


def test_summaries_that_record_no_hash_cannot_be_verified():
    def unrecorded(summary):
        summary["versions"].pop("chunk_hash")
    found = check(evaluate(PLAN, 4, g4_real(unrecorded)))
    assert not found["ok"] and "no chunk hash recorded (versions.chunk_hash from the deploy manifest)" in found["detail"]


def test_a_simulated_sharing_test_is_not_held_to_it():
    found = check(evaluate(PLAN, 4, synthetic.gate_inputs(4)))
    assert found["ok"] and found["detail"] == "no real populate or share phase to check"
