"""Small builders for judge tests: hand-made request records and one-gate plans."""
from __future__ import annotations

import json

import yaml

from gates.judge import synthetic
from gates.plan import PLANS_DIR, Plan, validate_plan


def request(arm: str, ttft: float | None, *, t_send: float = 0.0, t_end: float | None = None, concurrency: int = 1,
            repetition: int = 1, phase: str = "measure", session: str = "s", output_tokens: int = 10,
            prompt_tokens: int = 100, cached_tokens: int | None = None, status: str = "ok",
            simulated: bool = True, **extra) -> dict:
    if cached_tokens is None:
        cached_tokens = 0 if arm == "recompute" else prompt_tokens
    record = {
        "schema": "fxpilot.request/1", "run_id": "test", "arm": arm, "instance": "node1:8000", "phase": phase,
        "concurrency": concurrency, "repetition": repetition, "session": session, "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens, "output_tokens": output_tokens, "t_send": t_send,
        "t_first_token": None if ttft is None else t_send + ttft,
        "t_end": t_end if t_end is not None else t_send + (ttft or 0) + 1.0, "wall_anchor": 1.7e9,
        "status": status, "error": None if status == "ok" else "boom", "simulated": simulated,
    }
    record.update(extra)
    return record


def jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def summaries_file(records: list[dict], name: str = "records.summary.json") -> tuple[str, bytes]:
    """Phase summaries whose /metrics deltas agree with the records' cached tokens: a cache arm's measure phase
    counts only with them (docs/judge.md, hit-behaviour-matches-arm)."""
    import pandas as pd

    frame = pd.DataFrame(records)
    frame["cached_tokens"] = frame["cached_tokens"].astype(float).where(frame["status"] == "ok", 0.0)  # a failure hit nothing
    return name, synthetic.jsonl(synthetic.phase_summaries(frame))


def inventory_file(node: str = "node1", **changes) -> tuple[str, bytes]:
    return f"{node}/inventory.json", json.dumps(synthetic.inventory(node, **changes)).encode()


def plan_with(criteria: list[dict], *, gate: int = 3, **judging) -> Plan:
    """The default plan with one gate's criteria replaced (and judging settings changed)."""
    document = yaml.safe_load((PLANS_DIR / "default.yaml").read_text(encoding="utf-8"))
    document["judging"].update({"runs": 1, **judging})  # one run: its looks spend the whole α
    for raw in document["gates"]:
        if raw["number"] == gate:
            raw["criteria"] = [{"description": c.get("key", "c"), "op": ">=", "threshold": 0, **c} for c in criteria]
    return validate_plan(document, source="test plan")
