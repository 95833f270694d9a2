"""The report context: everything a report shows, read once from the ORM into plain dicts and lists.

Rendering (render.py) never touches the database; this module never renders. Attachments are listed
with the path of their content-addressed file (or their bytes, for files made here such as the
verdict), and render.py re-hashes each before it goes into the PDF.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from gates.evaluation import extension_history
from gates.lifecycle import evidence_sha256
from gates.models import Evaluation, Gate, Pilot, SignOff
from runners.artifacts import ArtifactMismatch, get_bytes, read_artifact
from runners.models import Artifact, Node

# KV-cache bytes per token = 2 (K and V) × layers × KV heads × head dimension × bytes per value (bf16 = 2).
KNOWN_MODELS = {
    "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8": {"layers": 62, "kv_heads": 8, "head_dim": 128, "dtype_bytes": 2},
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": {"layers": 62, "kv_heads": 8, "head_dim": 128, "dtype_bytes": 2},
}
MAX_RECORDS_BYTES = 512 * 1024 * 1024
PROJECTION_COMPARISONS = ("speedup", "reduction", "gain")


def _iso(value) -> str | None:
    """Dates as ISO dates; times as 'YYYY-MM-DD HH:MM UTC' for a reader."""
    if not value:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return value.isoformat()


def _person(user) -> str:
    if user is None:
        return ""
    return user.get_full_name() or user.get_username()


def pilot_context(pilot: Pilot) -> dict[str, Any]:
    return {
        "code": str(pilot.code), "name": pilot.name, "customer": pilot.customer.name, "vendor": pilot.vendor.name,
        "model_under_test": pilot.model_under_test, "llm_model": pilot.llm_model,
        "start_date": _iso(pilot.start_date), "state": pilot.state, "state_label": str(pilot.get_state_display()),
        "halted_reason": pilot.halted_reason, "customer_concurrency": pilot.customer_concurrency,
        "sessions_kept": pilot.sessions_kept,
    }


def _plan_gate(gate: Gate) -> dict[str, Any]:
    version = gate.pilot.signed_plan or gate.pilot.latest_plan
    for item in (version.document.get("gates", []) if version else []):
        if item.get("number") == gate.number:
            return item
    return {}


def gate_context(gate: Gate) -> dict[str, Any]:
    planned = _plan_gate(gate)
    return {
        "number": gate.number, "label": gate.label, "name": gate.name, "name_zh": gate.name_zh,
        "state": gate.state, "state_label": str(gate.get_state_display()), "verdict": gate.verdict,
        "week_start": gate.week_start, "week_end": gate.week_end,
        "planned_start": _iso(gate.planned_start), "planned_end": _iso(gate.planned_end),
        "opened_at": _iso(gate.opened_at), "closed_at": _iso(gate.closed_at),
        "proves": planned.get("proves", ""), "proves_zh": planned.get("proves_zh", ""),
        "arms": list(planned.get("arms", [])),
    }


def signoff_context(signoff: SignOff) -> dict[str, Any]:
    return {
        "party": signoff.party, "party_label": str(signoff.get_party_display()), "person": _person(signoff.person),
        "role": signoff.role, "role_label": str(signoff.get_role_display()), "decision": signoff.decision,
        "decision_label": str(signoff.get_decision_display()), "comment": signoff.comment,
        "created": _iso(signoff.created), "evidence_sha256": signoff.evidence_sha256,
        "subject": signoff.gate.label if signoff.gate_id else f"plan v{signoff.plan_version.number}",
        "evaluation": signoff.evaluation_id,
    }


def _safe_file_name(name: str, taken: set[str]) -> str:
    base = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name.replace("/", "_")).strip("._") or "artifact"
    candidate, number = base, 2
    while candidate in taken or candidate == "manifest.json":
        candidate, number = f"{number}_{base}", number + 1
    taken.add(candidate)
    return candidate


def evaluation_artifacts(evaluation: Evaluation, *, prefix: str = "", taken: set[str] | None = None) -> tuple[list[dict], list[dict]]:
    """(attachments, missing): the verdict itself, the job's artifacts and every other input the judge named."""
    taken = set() if taken is None else taken
    verdict_bytes = json.dumps(evaluation.result, sort_keys=True, indent=1, ensure_ascii=False).encode()
    items = [{"file": _safe_file_name(f"{prefix}verdict.json", taken), "name": f"{prefix}verdict.json",
              "kind": "verdict", "data": verdict_bytes, "simulated": bool(evaluation.simulated), "node": ""}]
    rows = list(Artifact.objects.filter(job_id=evaluation.job_id).select_related("node")) if evaluation.job_id else []
    seen = {(a.name, a.sha256) for a in rows}
    inputs = dict(evaluation.inputs or {}) | dict((evaluation.result or {}).get("inputs") or {})
    missing = []
    for name, sha256 in sorted(inputs.items()):
        if (name, sha256) in seen:
            continue
        other = Artifact.objects.filter(sha256=sha256).select_related("node").first()
        if other is None:
            missing.append({"name": name, "sha256": sha256})
        else:
            seen.add((name, sha256))
            rows.append(other)
    for artifact in sorted(rows, key=lambda a: a.name):
        items.append({"file": _safe_file_name(prefix + artifact.name, taken), "name": artifact.name, "kind": artifact.kind,
                      "storage_name": artifact.storage_name, "sha256": artifact.sha256, "size": artifact.size,
                      "simulated": artifact.simulated, "node": artifact.node.name if artifact.node_id else ""})
    return items, missing


def inventories(pilot: Pilot, verdict: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The inventories the judge used; otherwise the last probe of each of the pilot's nodes."""
    used = [item for item in (verdict or {}).get("inventory") or [] if isinstance(item, dict)]
    if used:
        return used
    return [dict(node.inventory, node=node.inventory.get("node", node.name))
            for node in Node.objects.filter(site__pilot=pilot).order_by("name") if node.inventory]


def signing_context() -> dict[str, Any]:
    return {"tsa_url": settings.FXPILOT_TSA_URL or None, "signer": "", "approver_possible": True}


def gate_report_context(gate: Gate, evaluation: Evaluation | None = None) -> dict[str, Any]:
    evaluation = evaluation or gate.latest_evaluation
    if evaluation is None:
        raise ValueError(f"{gate.label} of {gate.pilot.name} has no evaluation yet: there is nothing to report")
    if evaluation.gate_id != gate.pk:
        raise ValueError(f"evaluation {evaluation.pk} belongs to another gate than {gate.label}")
    verdict = dict(evaluation.result or {})
    attachments, missing = evaluation_artifacts(evaluation)
    inventory = inventories(gate.pilot, verdict)
    simulated = (bool(evaluation.simulated) or bool(verdict.get("simulated")) or any(a["simulated"] for a in attachments)
                 or any(item.get("simulated") for item in inventory))
    signoffs = [signoff_context(s) for s in gate.signoffs.filter(evaluation=evaluation).select_related("person", "gate")]
    return {
        "kind": "gate", "simulated": simulated, "pilot": pilot_context(gate.pilot), "gate": gate_context(gate),
        "evaluation": {"id": evaluation.pk, "created": _iso(evaluation.created), "verdict": evaluation.verdict,
                       "plan_version": evaluation.plan_version.number, "job": str(evaluation.job.code) if evaluation.job_id else "",
                       "evidence_sha256": evidence_sha256(evaluation)},
        "verdict": verdict, "signoffs": signoffs, "inventory": inventory, "extended": extension_history(evaluation),
        "attachments": attachments, "missing_inputs": missing, "signing": signing_context(),
    }


# --- the procurement report ------------------------------------------------------------------------

def interpolate(points: list[tuple[float, float]], at: float) -> tuple[float | None, str]:
    """Value at `at` on a log2(concurrency) scale between measured levels: (value, how)."""
    points = sorted(points)
    if not points:
        return None, "none"
    for x, y in points:
        if x == at:
            return y, "measured"
    if len(points) == 1 or at < points[0][0] or at > points[-1][0]:
        return None, "outside"
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 < at < x1:
            share = (math.log2(at) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
            return y0 + share * (y1 - y0), "interpolated"
    return None, "outside"


def projections(evaluations: dict[int, Evaluation], concurrency: int) -> list[dict[str, Any]]:
    """The G3/G4 comparisons (speed-up, reduction, gain) carried to the customer's concurrency."""
    rows = []
    for number in (3, 4):
        evaluation = evaluations.get(number)
        if evaluation is None:
            continue
        for criterion in (evaluation.result or {}).get("criteria", []):
            if criterion.get("comparison") not in PROJECTION_COMPARISONS:
                continue
            cells = [c for c in criterion.get("cells") or [] if c.get("concurrency") and c.get("value") is not None]
            row = {"gate": number, "key": criterion.get("key"), "description": criterion.get("description", ""),
                   "description_zh": criterion.get("description_zh", ""), "metric": criterion.get("metric"),
                   "comparison": criterion.get("comparison"), "candidate": criterion.get("candidate"),
                   "baseline": criterion.get("baseline"), "phase": criterion.get("phase"),
                   "verdict": criterion.get("verdict"), "unit": criterion.get("unit", ""),
                   "levels": sorted(int(c["concurrency"]) for c in cells)}
            if criterion.get("phase") == "replay" or not cells:
                # A replay of the customer's own trace already is their traffic: no projection needed.
                row.update(value=criterion.get("value"), low=(criterion.get("ci") or [None])[0], how="own-traffic"
                           if criterion.get("phase") == "replay" else "measured-overall")
            else:
                value, how = interpolate([(float(c["concurrency"]), float(c["value"])) for c in cells], concurrency)
                lows = [(float(c["concurrency"]), float(c["ci"][0])) for c in cells if c.get("ci")]
                low, _ = interpolate(lows, concurrency) if len(lows) == len(cells) else (None, "")
                row.update(value=value, low=low, how=how)
            rows.append(row)
    return rows


def _records_session_tokens(evaluation: Evaluation | None) -> list[int]:
    """Final context length (prompt + output tokens of its last turn) of each replayed session."""
    if evaluation is None or not evaluation.job_id:
        return []
    longest: dict[str, int] = defaultdict(int)
    budget = MAX_RECORDS_BYTES
    for artifact in Artifact.objects.filter(job_id=evaluation.job_id).order_by("name"):
        if not artifact.name.endswith(".jsonl") or artifact.size > budget:
            continue
        budget -= artifact.size
        try:
            lines = read_artifact(artifact).decode("utf-8", errors="replace").splitlines()
        except ArtifactMismatch:
            continue
        for line in lines:
            if '"replay"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("schema") == "fxpilot.request/1" and record.get("phase") == "replay" and record.get("session"):
                tokens = int(record.get("prompt_tokens") or 0) + int(record.get("output_tokens") or 0)
                key = f"{record.get('arm')}/{record['session']}"
                longest[key] = max(longest[key], tokens)
    return list(longest.values())


def sizing(pilot: Pilot, g4: Evaluation | None) -> dict[str, Any]:
    """KV bytes per token × session length × sessions kept → FX capacity, with where each number came from."""
    deployment = pilot.deployment or {}
    per_token, per_token_source = deployment.get("kv_bytes_per_token"), "pilot setting kv_bytes_per_token"
    shape = KNOWN_MODELS.get(pilot.llm_model)
    if not per_token and shape:
        per_token = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * shape["dtype_bytes"]
        per_token_source = (f"2 × {shape['layers']} layers × {shape['kv_heads']} KV heads × {shape['head_dim']} "
                            f"head dimension × {shape['dtype_bytes']} bytes (bf16) for {pilot.llm_model}")
    lengths = _records_session_tokens(g4)
    if lengths:
        ordered = sorted(lengths)
        mean = statistics.fmean(ordered)
        p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
        length_source = f"{len(ordered)} sessions of the G4 replay records (final context of each session)"
    elif deployment.get("session_tokens"):
        mean = p90 = float(deployment["session_tokens"])
        length_source = "pilot setting session_tokens"
    else:
        mean = p90 = None
        length_source = ""
    result = {"kv_bytes_per_token": per_token, "kv_bytes_source": per_token_source if per_token else "",
              "session_tokens_mean": mean, "session_tokens_p90": p90, "session_source": length_source,
              "sessions_kept": pilot.sessions_kept, "capacity_bytes": None, "capacity_bytes_p90": None}
    if per_token and mean:
        result["capacity_bytes"] = float(per_token) * mean * pilot.sessions_kept
        result["capacity_bytes_p90"] = float(per_token) * p90 * pilot.sessions_kept
    return result


def procurement_report_context(pilot: Pilot) -> dict[str, Any]:
    gates, evaluations, attachments, missing = [], {}, [], []
    taken: set[str] = set()
    for gate in pilot.gates.order_by("number"):
        evaluation = gate.latest_evaluation
        item = {"gate": gate_context(gate), "evaluation": None, "verdict": {}, "signoffs": []}
        if evaluation is not None:
            evaluations[gate.number] = evaluation
            found, lost = evaluation_artifacts(evaluation, prefix=f"G{gate.number}/", taken=taken)
            attachments += found
            missing += lost
            item.update(
                evaluation={"id": evaluation.pk, "created": _iso(evaluation.created), "verdict": evaluation.verdict,
                            "evidence_sha256": evidence_sha256(evaluation)},
                verdict=dict(evaluation.result or {}), extended=extension_history(evaluation),
                signoffs=[signoff_context(s) for s in gate.signoffs.filter(evaluation=evaluation).select_related("person", "gate")],
            )
        gates.append(item)
    plan_signoffs = [signoff_context(s) for s in
                     SignOff.objects.filter(pilot=pilot, plan_version__isnull=False).select_related("person", "plan_version")]
    inventory = inventories(pilot, evaluations[1].result if 1 in evaluations else None)
    simulated = (any(e.simulated or (e.result or {}).get("simulated") for e in evaluations.values())
                 or any(a["simulated"] for a in attachments) or any(i.get("simulated") for i in inventory))
    return {
        "kind": "procurement", "simulated": simulated, "pilot": pilot_context(pilot), "gate": None, "gates": gates,
        "plan_signoffs": plan_signoffs, "inventory": inventory,
        "projections": projections(evaluations, pilot.customer_concurrency),
        "sizing": sizing(pilot, evaluations.get(4)), "attachments": attachments, "missing_inputs": missing,
        "signing": signing_context(), "evaluation": None, "verdict": {},
        "plan_sha256": (pilot.signed_plan.sha256 if pilot.signed_plan else ""),
    }


def read_attachment(item: dict[str, Any]) -> bytes:
    """The bytes of one listed attachment, from the context or the evidence store (hashed again)."""
    if "data" in item:
        return item["data"]
    return get_bytes(item["storage_name"], item["sha256"])
