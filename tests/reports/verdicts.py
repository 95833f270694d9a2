"""G3 verdicts from the real judge on synthetic Table-1 inputs (gates.judge.synthetic), and a report context
built from one without a database."""
from __future__ import annotations

import copy
import json
from functools import cache

from gates.judge import synthetic, verdicts
from gates.plan import load_plan


def g3_inputs(*, table: dict | None = None, simulated: bool = True) -> list[tuple[str, bytes]]:
    """Records, phase summaries and two inventories for G3; `table` as synthetic.TABLE_1 (arm → level → figures)."""
    frame = synthetic.table1_frame(table=table, simulated=simulated)
    files = [("records.jsonl", synthetic.jsonl(synthetic.records(frame))),
             ("records.summary.json", synthetic.jsonl(synthetic.phase_summaries(frame)))]
    files += [(f"{node}/inventory.json", json.dumps(synthetic.inventory(node, simulated=simulated), indent=1).encode())
              for node in ("node1", "node2")]
    return files


@cache
def _judged(simulated: bool) -> dict:
    return verdicts.evaluate(load_plan(), 3, g3_inputs(simulated=simulated))


def table1_verdict(*, simulated: bool = True) -> dict:
    """The judge's G3 verdict on Table 1 (all criteria pass); a fresh copy each time."""
    return copy.deepcopy(_judged(simulated))


def gate_context(verdict: dict, *, simulated: bool = True, attachments: list[dict] | None = None,
                 pilot_name: str = "FX100 joint test — Example Cloud") -> dict:
    """A report context as reports.context builds it, without a database."""
    return {
        "kind": "gate", "simulated": simulated,
        "pilot": {"code": "3f2b6c1e-0000-4000-8000-000000000001", "name": pilot_name, "customer": "Example Cloud",
                  "vendor": "FX Storage", "model_under_test": "FX100", "llm_model": "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8",
                  "start_date": "2026-09-01", "state": "active", "state_label": "Active", "halted_reason": "",
                  "customer_concurrency": 24, "sessions_kept": 10000},
        "gate": {"number": 3, "label": "G3", "name": "Performance", "name_zh": "性能", "state": "awaiting_signoff",
                 "state_label": "Passed — awaiting sign-off", "verdict": "pass", "week_start": 5, "week_end": 7,
                 "planned_start": "2026-09-29", "planned_end": "2026-10-19", "opened_at": "2026-09-29 08:00 UTC",
                 "closed_at": None, "proves": "The published gains hold on this cluster.",
                 "proves_zh": "公开发布的收益在本集群上成立。", "arms": ["fx", "local_nvme", "recompute"]},
        "evaluation": {"id": 1, "created": "2026-10-15 10:00 UTC", "verdict": verdict["verdict"], "plan_version": 1,
                       "job": "", "evidence_sha256": "e" * 64},
        "verdict": verdict, "signoffs": [], "inventory": verdict.get("inventory", []),
        "attachments": attachments if attachments is not None else [
            {"file": "verdict.json", "name": "verdict.json", "kind": "verdict", "data": b"{}", "simulated": simulated, "node": ""}],
        "missing_inputs": [], "signing": {"tsa_url": None, "signer": "fxpilot evidence signer"},
        "code": "9d5c7a10-0000-4000-8000-000000000002", "created": "2026-10-15T10:05:00+00:00",
    }
