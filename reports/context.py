"""The report context: everything a report shows, read once from the ORM into plain dicts and lists.

Rendering (render.py) never touches the database; this module never renders. Attachments are listed
with the path of their content-addressed file (or their bytes, for files made here such as the
verdict), and render.py re-hashes each before it goes into the PDF.
"""
from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from django.conf import settings
from django.utils.translation import gettext_noop

from gates.judge import tiers as judge_tiers
from gates.judge.records import load_inputs
from gates.lifecycle import evidence_sha256
from gates.models import AuditEvent, CustomerTrace, Evaluation, Gate, Pilot, SignOff
from gates.outcome import outcome_of
from gates.sizing import SessionLengths, SizingSettingsError, compute, length_summary, trace_csv_session_lengths
from gates.traces.analysis import analyse, reuse_report, session_final_lengths
from gates.traces.fidelity import fidelity
from gates.traces.fidelity import strata as replay_strata
from gates.traces.formats import TraceFormatError, read_bytes
from gates.traces.predict import predicted_gain
from reports.findings import said
from reports.units import rounded
from runners import gateplans
from runners.artifacts import ArtifactMismatch, get_bytes, read_artifact
from runners.evaluation import extension_history
from runners.models import Artifact, Job, Node

TRACE_GATE = 4

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


def root_certificate() -> dict[str, Any]:
    """The vendor root a reader must trust: its subject and SHA-256 fingerprint (of the DER certificate)."""
    path = Path(settings.FXPILOT_SIGNING_ROOT)
    try:
        certificate = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return {"subject": "", "sha256": "", "file": path.name}
    digest = certificate.fingerprint(hashes.SHA256()).hex().upper()
    return {"subject": certificate.subject.rfc4514_string(), "file": path.name,
            "sha256": ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))}


def signing_context() -> dict[str, Any]:
    return {"tsa_url": settings.FXPILOT_TSA_URL or None, "signer": "", "approver_possible": True,
            "root": root_certificate(), "countersignature": None, "supersedes": None, "version": 1}


def gate_history(gate: Gate, until: Evaluation | None = None) -> list[dict[str, Any]]:
    """What happened at a gate, oldest first: runs (and why one was run again), evaluations, extensions, rejections."""
    limit = until.created if until is not None else None
    events: list[dict[str, Any]] = []
    jobs = list(Job.objects.filter(gate=gate, kind=Job.Kind.GATE_RUN).select_related("created_by").order_by("created", "id"))
    previous = None
    for job in jobs:
        if limit is not None and job.created > limit:
            break
        why = ""
        if previous is not None:
            why = previous["outcome"]
        outcome = {"failed": "failed", "error": f"error: {job.error}".strip(": ") if job.error else "error",
                   "canceled": "canceled"}.get(job.status, job.status)
        events.append({"when": _iso(job.created), "at": job.created, "kind": "rerun" if previous else "run",
                       "job": str(job.code), "short": str(job.code)[:8], "status": job.status,
                       "who": _person(job.created_by) or job.created_by_label, "reason": why,
                       "repetitions": (job.params or {}).get("repetitions")})
        previous = {"outcome": outcome}
        for step in job.steps.filter(name="evaluate").order_by("seq"):
            result = step.result or {}
            if result.get("extended"):
                added = job.steps.filter(seq__gt=step.seq).exclude(name="report").count()
                events.append({"when": _iso(step.finished or job.created), "at": step.finished or job.created,
                               "kind": "extended", "job": str(job.code), "short": str(job.code)[:8],
                               "evaluation": result.get("evaluation"), "added_steps": added,
                               "repetition": result.get("repetitions_done")})
    for evaluation in gate.evaluations.order_by("created", "id"):
        if limit is not None and evaluation.created > limit:
            continue
        failed = [c.get("key") for c in (evaluation.result or {}).get("criteria", []) if c.get("verdict") not in ("pass", None)]
        events.append({"when": _iso(evaluation.created), "at": evaluation.created, "kind": "evaluation",
                       "evaluation": evaluation.pk, "verdict": evaluation.verdict,
                       "job": str(evaluation.job.code) if evaluation.job_id else "",
                       "short": str(evaluation.job.code)[:8] if evaluation.job_id else "",
                       "criteria": [k for k in failed if k], "final": until is not None and evaluation.pk == until.pk})
    for event in AuditEvent.objects.filter(pilot=gate.pilot, object_type="gate", object_id=str(gate.pk),
                                           action__in=["gate.extended", "gate.reject"]).order_by("created", "id"):
        if limit is not None and event.created > limit:
            continue
        events.append({"when": _iso(event.created), "at": event.created,
                       "kind": "review-extended" if event.action == "gate.extended" else "rejected",
                       "who": event.actor_label, "reason": (event.detail or {}).get("comment", "")})
    events.sort(key=lambda e: (e["at"], {"run": 0, "rerun": 0, "evaluation": 1, "extended": 2}.get(e["kind"], 3)))
    for event in events:
        event.pop("at")
    return events


def history_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts a reader needs at a glance: runs, marginal evaluations, extensions, steps added, rejections."""
    return {"runs": sum(1 for e in history if e["kind"] in ("run", "rerun")),
            "marginal": sum(1 for e in history if e["kind"] == "evaluation" and e["verdict"] == "marginal"),
            "extensions": sum(1 for e in history if e["kind"] in ("extended", "review-extended")),
            "added_steps": sum(e.get("added_steps") or 0 for e in history if e["kind"] == "extended"),
            "rejections": sum(1 for e in history if e["kind"] == "rejected")}


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
    history = gate_history(gate, evaluation)
    return {
        "kind": "gate", "simulated": simulated, "pilot": pilot_context(gate.pilot), "gate": gate_context(gate),
        "history": history, "history_summary": history_summary(history),
        "trace": _trace(gate, evaluation),
        "tier_shares": tier_share_table(evaluation) if gate.number == TRACE_GATE else None,
        "predicted_vs_measured": (predicted_vs_measured(evaluation, gate.pilot) if gate.number == TRACE_GATE
                                  else None),
        "evaluation": {"id": evaluation.pk, "created": _iso(evaluation.created), "verdict": evaluation.verdict,
                       "plan_version": evaluation.plan_version.number, "job": str(evaluation.job.code) if evaluation.job_id else "",
                       "evidence_sha256": evidence_sha256(evaluation)},
        "verdict": verdict, "signoffs": signoffs, "inventory": inventory, "extended": extension_history(evaluation),
        "attachments": attachments, "missing_inputs": missing, "signing": signing_context(),
    }


def session_lengths_of_job(job) -> SessionLengths:
    """Session lengths of the trace a G4 run replayed: the customer's, or the generated sample (said so)."""
    artifact = Artifact.objects.filter(job=job, kind="trace").order_by("name").first() if job is not None else None
    if artifact is None:
        return SessionLengths([], "")
    try:
        data = read_artifact(artifact)
        tokens = trace_csv_session_lengths(data)
        if not tokens:       # a public format (docs/traces.md): sessions given, inferred or one per request
            tokens = session_final_lengths(analyse(read_bytes(data, artifact.name)))
    except (ArtifactMismatch, OSError, TraceFormatError):
        return SessionLengths([], "")
    source = "sample-trace" if artifact.name.startswith("sample") else "customer-trace"
    return SessionLengths(tokens, source, f"{artifact.name} sha256 {artifact.sha256}")


def trace_of_job(job, with_reuse: bool = False) -> dict[str, Any] | None:
    """What a G4 run replayed, for pages and reports: {"customer", "name", "sha256", "size", "sessions", "lengths",
    "replay" (what the replay step sampled: share, rates, prompts cut — docs/traces.md), "reuse" (the trace's
    reuse analysis, or known: false with the reason)}."""
    artifact = Artifact.objects.filter(job=job, kind="trace").order_by("name").first() if job is not None else None
    if artifact is None:
        return None
    lengths = session_lengths_of_job(job)
    # The run stores the trace under a fixed artifact name; the customer knows it by the file he uploaded.
    upload = (CustomerTrace.objects.filter(pilot_id=job.pilot_id, sha256=artifact.sha256).order_by("-created").first()
              if lengths.customer else None)
    return {"customer": lengths.customer, "name": upload.name if upload is not None else artifact.name,
            "artifact": artifact.name, "sha256": artifact.sha256, "size": artifact.size,
            "sessions": len(lengths.tokens), "lengths": length_summary(lengths.tokens),
            "replay": replay_sample_of_job(job),
            # the reuse analysis reads the whole trace: reports ask for it, pages (web requests) do not
            "reuse": trace_reuse_of_job(job) if with_reuse else None,
            "fidelity": replay_fidelity(job) if with_reuse else None}


FIDELITY_SHARE = 0.8
"""The share of the reuse its trace allows a replay should reach, unless the plan's `workloads.replay.fidelity_share`
says otherwise (stated in the G4 report; not judged yet). `workloads.replay.ttft_objective_s`, when set, adds the
goodput of each stratum and arm: the share of its requests whose first token came within the objective."""


def _replay_records(job) -> list[dict]:
    out = []
    for artifact in Artifact.objects.filter(job=job, kind="records").order_by("name"):
        try:
            data = read_artifact(artifact)
        except (ArtifactMismatch, OSError):
            continue
        for line in data.splitlines():
            if b'"replay"' in line:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("phase") == "replay":
                    out.append(record)
    return out


def replay_fidelity(job) -> dict[str, Any] | None:
    """Did the replay get the reuse its trace allows, and what did each stratum gain (gates.traces.fidelity)?
    From the run's replay records and the oracle the replay step kept; None when either is missing."""
    sample = replay_sample_of_job(job) if job is not None else None
    found = (sample or {}).get("oracle")
    if not found:
        return None
    records = _replay_records(job)
    if not records:
        return None
    arms = {r.get("arm") for r in records}
    try:
        replay = gateplans.workloads(job).get("replay") or {}
    except (AttributeError, ValueError):   # no signed plan to read (a plan that no longer verifies says so elsewhere)
        replay = {}
    share = float(replay.get("fidelity_share") or FIDELITY_SHARE)
    objective = replay.get("ttft_objective_s")
    objective = float(objective) if isinstance(objective, (int, float)) and objective > 0 else None
    checks = [fidelity(records, int(found["ideal_hit_tokens"]), share, arm=arm)
              for arm in ("fx", "local_nvme") if arm in arms]
    return {"checks": [dict(c, arm=arm) for c, arm in zip(checks, [a for a in ("fx", "local_nvme") if a in arms],
                                                          strict=True)],
            "strata": replay_strata(records, objective, ideal_hit_fraction=found.get("ideal_hit_fraction")),
            "oracle": found}


def _replay_summaries(job) -> list[dict]:
    """The phase summaries the G4 run collected (its records artifacts' `*.summary.json`), as the judge reads them."""
    items = []
    for artifact in Artifact.objects.filter(job=job, kind="records").order_by("name"):
        if not artifact.name.endswith(".json"):
            continue
        try:
            items.append((artifact.name, read_artifact(artifact)))
        except (ArtifactMismatch, OSError):
            continue
    if not items:
        return []
    try:
        return list(load_inputs(items).summaries)
    except Exception:  # noqa: BLE001 — summaries the judge itself would refuse: nothing measured to show here
        return []


def _share(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def tier_share_table(evaluation: Evaluation | None) -> dict[str, Any] | None:
    """G4's measured tier shares as the verdict states them (gates/judge/tiers.py, `tier_shares`): per arm of the
    replay, the share of prompt tokens HBM, DRAM and the disk tier (FX) served and what was recomputed, overall and
    per stratum. None when the verdict has no such block (an older verdict): the report then says "not measured"."""
    block = ((evaluation.result or {}) if evaluation is not None else {}).get("tier_shares")
    if not isinstance(block, dict):
        return None
    rows = []
    for row in block.get("arms") or []:
        if row.get("phase") not in ("replay", "measure", "soak", "capacity", "share"):
            continue
        base = {"arm": row.get("arm"), "phase": row.get("phase"), "disk_tier": row.get("disk_tier"),
                "disk_source": row.get("disk_source") or ""}
        rows.append(dict(base, stratum="", requests=None, hbm=_share(row.get("hbm")), dram=_share(row.get("dram")),
                         fx=_share(row.get("disk")), recomputed=_share(row.get("recomputed"))))
        for name, sub in sorted((row.get("strata") or {}).items()):
            rows.append(dict(base, stratum=name, requests=sub.get("requests"), hbm=_share(sub.get("hbm")),
                             dram=_share(sub.get("dram")), fx=_share(sub.get("disk")),
                             recomputed=_share(sub.get("recomputed"))))
    return {"basis": block.get("basis") or "", "rows": rows}


def _criterion(evaluation: Evaluation | None, **match) -> dict[str, Any] | None:
    for c in ((evaluation.result or {}) if evaluation is not None else {}).get("criteria") or []:
        if all(c.get(k) == v for k, v in match.items()):
            return c
    return None


def _first_cell(criterion: dict[str, Any] | None) -> dict[str, Any]:
    cells = [c for c in (criterion or {}).get("cells") or [] if c.get("value") is not None]
    return cells[0] if cells else {}


def predicted_vs_measured(evaluation: Evaluation | None, pilot: Pilot) -> dict[str, Any] | None:
    """One account of G4's prediction and measurement (issue 44): the trace's ideal reuse, the replayed sample's, the
    FX share predicted at the deployment's HBM and DRAM sizes, the FX share measured per repetition, the predicted
    and measured speed-ups, and the reasons for any gap. Every figure from the run's replay sample (runners.
    tracereplay) and the verdict; None (said "not measured") where they have none. None when G4 replayed nothing."""
    if evaluation is None or evaluation.job is None:
        return None
    sample = replay_sample_of_job(evaluation.job)
    if sample is None:
        return None
    found = sample.get("oracle") or {}
    predicted_tiers = ((found.get("tiers") or {}).get("overall") or {}).get("share") or {}
    trace_tiers = ((sample.get("trace_tiers") or {}).get("overall") or {}).get("share") or {}
    sizing_ = sample.get("sizing") or {}
    repetitions = []
    summaries = [s for s in _replay_summaries(evaluation.job) if s.get("phase") == "replay" and s.get("arm") == "fx"]
    for repetition in sorted({int(s.get("repetition") or 1) for s in summaries}):
        mine = [s for s in summaries if int(s.get("repetition") or 1) == repetition]
        shares = judge_tiers.tier_shares(SimpleNamespace(summaries=mine), None).get("arms") or []
        row = shares[0] if shares else {}
        repetitions.append({"repetition": repetition, "fx": _share(row.get("disk")), "dram": _share(row.get("dram")),
                            "hbm": _share(row.get("hbm")), "cached": (None if _share(row.get("recomputed")) is None
                                                                      else 1.0 - float(row["recomputed"])),
                            "source": row.get("disk_source") or ""})
    reuse = trace_reuse_of_job(evaluation.job)
    plan = evaluation.plan_version.to_plan() if evaluation.plan_version_id else None
    reference = (plan.planning or {}).get("reference") if plan is not None else None
    predicted = predicted_gain(reuse, reference, pilot.customer_concurrency) if reuse else None
    recompute = _first_cell(_criterion(evaluation, phase="replay", comparison="speedup", baseline="recompute"))
    beyond = _first_cell(_criterion(evaluation, phase="replay", comparison="speedup", baseline="dram"))
    out = {
        "trace_ideal": _share(sample.get("trace_ideal_hit_fraction")),
        "sample_ideal": _share(found.get("ideal_hit_fraction")),
        "predicted_fx": _share(predicted_tiers.get("fx")), "predicted_dram": _share(predicted_tiers.get("dram")),
        "predicted_hbm": _share(predicted_tiers.get("hbm")), "trace_fx": _share(trace_tiers.get("fx")),
        "hbm_tokens": sizing_.get("hbm_tokens"), "dram_tokens": sizing_.get("dram_tokens"),
        "working_set_tokens": sizing_.get("working_set_tokens"), "needs_tier": sizing_.get("needs_tier"),
        "repetitions": repetitions,
        "predicted_speedup": _share((predicted or {}).get("speedup")),
        "predicted_at": (predicted or {}).get("level"),
        "measured_speedup": _share(recompute.get("value")), "measured_ci": list(recompute.get("ci") or []),
        "beyond_dram": _share(beyond.get("value")), "beyond_dram_ci": list(beyond.get("ci") or []),
    }
    out["reasons"] = gap_reasons(out, sample)
    return out


GAP = 0.05
"""Two shares more than this apart (5 points) are a gap the table explains."""


def gap_reasons(row: dict[str, Any], sample: dict[str, Any]) -> list[dict[str, Any]]:
    """Why prediction and measurement differ, as findings (reports.findings) the report says in its language; none
    when they agree within GAP or there is nothing to compare."""
    reasons = []
    trace, chosen = row.get("trace_ideal"), row.get("sample_ideal")
    if trace is not None and chosen is not None and abs(trace - chosen) > GAP:
        reasons.append(said(gettext_noop("the replayed sample allows %(sample)s of its prompt tokens from a cache, the "
                                         "whole trace %(trace)s: the sample (whole sessions, chosen by hash) holds "
                                         "more reuse than the trace") if chosen > trace else gettext_noop(
            "the replayed sample allows %(sample)s of its prompt tokens from a cache, the whole trace %(trace)s: the "
            "sample (whole sessions, chosen by hash) holds less reuse than the trace"),
                            sample=f"{rounded(100 * chosen, 1)} %", trace=f"{rounded(100 * trace, 1)} %"))
    if row.get("needs_tier") is False:
        reasons.append(said(gettext_noop("the sample's working set (%(set)s tokens) fits in HBM and DRAM (%(above)s "
                                         "tokens): FX has little to serve in this replay"),
                            set=f"{int(row.get('working_set_tokens') or 0):,}",
                            above=f"{int(row.get('hbm_tokens') or 0) + int(row.get('dram_tokens') or 0):,}"))
    predicted = row.get("predicted_fx")
    for rep in row.get("repetitions") or []:
        if predicted is not None and rep.get("fx") is not None and abs(rep["fx"] - predicted) > GAP:
            reasons.append(said(gettext_noop("repetition %(n)s: FX served %(measured)s of the prompt tokens, %(predicted)s "
                                             "predicted at the configured sizes"),
                                n=rep["repetition"], measured=f"{rounded(100 * rep['fx'], 1)} %",
                                predicted=f"{rounded(100 * predicted, 1)} %"))
        elif rep.get("fx") is None and rep.get("source", "").startswith("unknown"):
            reasons.append(said(gettext_noop("repetition %(n)s: the FX share was not measured (%(why)s)"),
                                n=rep["repetition"], why=rep["source"]))
    if sample.get("idle_gaps_capped"):
        reasons.append(said(gettext_noop("%(n)s idle gaps were cut to %(cap)s s, which changes what sits in HBM and "
                                         "DRAM between turns"), n=sample["idle_gaps_capped"],
                            cap=sample.get("idle_gap_cap_s")))
    return reasons


def replay_sample_of_job(job) -> dict[str, Any] | None:
    """The first replay step's sampling figures (runners.tracereplay), as the run kept them."""
    artifact = Artifact.objects.filter(job=job, kind="replay-sample").order_by("created", "pk").first()
    if artifact is None:
        return None
    try:
        return json.loads(read_artifact(artifact))
    except (ArtifactMismatch, OSError, ValueError):
        return None


def trace_reuse_of_job(job) -> dict[str, Any] | None:
    """The reuse analysis (gates.traces) of the trace a G4 run replayed: what a cache could get from it."""
    artifact = Artifact.objects.filter(job=job, kind="trace").order_by("name").first() if job is not None else None
    if artifact is None:
        return None
    try:
        analysis = analyse(read_bytes(read_artifact(artifact), artifact.name))
    except (ArtifactMismatch, OSError, TraceFormatError):
        return None
    trace = analysis.trace
    duration = float(trace.timestamps.max() - trace.timestamps.min()) if trace.requests else 0.0
    # the traffic the reuse was counted on: a capacity read from its curve is what traffic of that volume needs
    return dict(reuse_report(analysis), scale={"requests": trace.requests, "sessions": analysis.sessions,
                                               "duration_s": duration})


def _trace(gate: Gate, evaluation: Evaluation | None) -> dict[str, Any] | None:
    if gate.number != TRACE_GATE or evaluation is None:
        return None
    return trace_of_job(evaluation.job, with_reuse=True) or {"customer": False, "name": "", "sha256": "", "sessions": 0, "lengths": {}}


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


def projections(evaluations: dict[int, Evaluation], concurrency: int, *, customer_trace: bool = False) -> list[dict[str, Any]]:
    """The G3/G4 comparisons (speed-up, reduction, gain) carried to the customer's concurrency.

    A G4 replay is the customer's traffic only when G4 replayed the customer's own trace; a replay of the
    generated sample trace is marked "sample-trace".
    """
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
                   "confidence": criterion.get("confidence"), "levels": sorted(int(c["concurrency"]) for c in cells)}
            if criterion.get("phase") == "replay" or not cells:
                # A replay of the customer's own trace already is their traffic: no projection needed.
                how = ("own-traffic" if customer_trace else "sample-trace") if criterion.get("phase") == "replay" \
                    else "measured-overall"
                row.update(value=criterion.get("value"), low=(criterion.get("ci") or [None])[0], how=how,
                           ci=list(criterion.get("ci") or [None, None]))
            else:
                value, how = interpolate([(float(c["concurrency"]), float(c["value"])) for c in cells], concurrency)
                lows = [(float(c["concurrency"]), float(c["ci"][0])) for c in cells if c.get("ci")]
                low, _ = interpolate(lows, concurrency) if len(lows) == len(cells) else (None, "")
                row.update(value=value, low=low, how=how, ci=_neighbour_envelope(cells, concurrency))
            rows.append(row)
    return rows


def _neighbour_envelope(cells: list[dict], concurrency: int) -> list[float | None]:
    """The interval at `concurrency`: the measured level's, or the envelope of the two neighbours' intervals."""
    cells = sorted(cells, key=lambda c: c["concurrency"])
    exact = [c for c in cells if int(c["concurrency"]) == concurrency]
    if exact:
        return list(exact[0].get("ci") or [None, None])
    below = [c for c in cells if c["concurrency"] < concurrency][-1:]
    above = [c for c in cells if c["concurrency"] > concurrency][:1]
    bounds = [b for c in below + above for b in (c.get("ci") or []) if b is not None]
    return [min(bounds), max(bounds)] if below and above and bounds else [None, None]


def sizing(pilot: Pilot, g4: Evaluation | None) -> dict[str, Any]:
    """The capacity to buy (gates.sizing) from the session lengths of the trace G4 replayed."""
    deployment = pilot.deployment or {}
    lengths = session_lengths_of_job(g4.job if g4 is not None else None)
    if not lengths.tokens and deployment.get("session_tokens"):
        lengths = SessionLengths([int(deployment["session_tokens"])], "setting", "deployment setting session_tokens")
    # the customer's own reuse sizes the tier (docs/traces.md); a generated sample trace's does not
    reuse = trace_reuse_of_job(g4.job) if g4 is not None and lengths.customer else None
    try:
        result = compute(model=deployment.get("model") or pilot.llm_model, settings=pilot.sizing,
                         vllm_flags=deployment.get("extra_vllm_flags") or [], lengths=lengths,
                         sessions_kept=pilot.sessions_kept, reuse=reuse).as_dict()
    except SizingSettingsError as error:
        result = compute(model=deployment.get("model") or pilot.llm_model, settings={}, lengths=lengths,
                         sessions_kept=pilot.sessions_kept, reuse=reuse).as_dict()
        result["settings_error"] = str(error)
    return result


def recompute_speedup(evaluations: dict[int, Evaluation], concurrency: int) -> dict[str, Any] | None:
    """TTFT speed-up against full recompute at the customer's concurrency: measured, interpolated, or the nearest level.

    Interpolated values carry the envelope of the two neighbouring levels' intervals (never narrower than either),
    since the interpolation itself is not measured.
    """
    evaluation = evaluations.get(3)
    criterion = next((c for c in ((evaluation.result or {}).get("criteria", []) if evaluation else [])
                      if c.get("comparison") == "speedup" and c.get("baseline") == "recompute"), None)
    if criterion is None:
        return None
    cells = sorted((c for c in criterion.get("cells") or [] if c.get("concurrency") and c.get("value") is not None),
                   key=lambda c: c["concurrency"])
    if not cells:
        return None
    row = {"key": criterion.get("key"), "verdict": criterion.get("verdict"), "threshold": criterion.get("threshold"),
           "confidence": criterion.get("confidence"), "levels": [int(c["concurrency"]) for c in cells],
           "concurrency": concurrency}
    exact = next((c for c in cells if int(c["concurrency"]) == concurrency), None)
    if exact is not None:
        return dict(row, how="measured", value=exact["value"], ci=list(exact.get("ci") or [None, None]), at=concurrency)
    below = [c for c in cells if c["concurrency"] < concurrency]
    above = [c for c in cells if c["concurrency"] > concurrency]
    if below and above:
        low, high = below[-1], above[0]
        value, _ = interpolate([(float(low["concurrency"]), low["value"]), (float(high["concurrency"]), high["value"])],
                               concurrency)
        bounds = [b for c in (low, high) for b in (c.get("ci") or []) if b is not None]
        return dict(row, how="interpolated", value=value, ci=[min(bounds), max(bounds)] if bounds else [None, None],
                    between=[int(low["concurrency"]), int(high["concurrency"])], at=concurrency)
    nearest = min(cells, key=lambda c: abs(math.log2(c["concurrency"]) - math.log2(concurrency)))
    return dict(row, how="nearest", value=nearest["value"], ci=list(nearest.get("ci") or [None, None]),
                at=int(nearest["concurrency"]))


def decision(pilot: Pilot) -> dict[str, Any]:
    """The pilot's outcome as gates.outcome decides it (the overview, the API and the demo print the same): its
    code (`outcome`), the gate it rests on, and its words in both languages."""
    found = outcome_of(pilot).as_dict()
    return dict(found, outcome=found["code"])


def capacity_check(evaluation: Evaluation | None) -> dict[str, Any] | None:
    """G4's capacity check at pilot scale as its verdict judged it (gates/traces/capacity.py, docs/judge.md): the cap,
    the measured and predicted external-hit shares, their difference and the criterion's verdict; None when the G4
    evaluation has no such criterion."""
    if evaluation is None:
        return None
    found = next((c for c in (evaluation.result or {}).get("criteria") or []
                  if c.get("metric") == "capacity_agreement"), None)
    if found is None:
        return None
    cell = (found.get("cells") or [{}])[0]
    difference = cell.get("difference")
    return {"key": found["key"], "verdict": found["verdict"], "tolerance": found.get("threshold"),
            "simulated": bool((evaluation.result or {}).get("simulated")), "applicable": bool(cell.get("applicable")),
            "reason": cell.get("reason"), "capacity_tokens": cell.get("capacity_tokens"),
            "capacity_for_share_tokens": cell.get("capacity_for_share_tokens"), "fraction": cell.get("fraction"),
            "share": cell.get("share"), "measured": cell.get("measured"), "predicted": cell.get("predicted"),
            "difference_points": None if difference is None else round(100 * difference, 1),
            "explanation": found.get("explanation"), "explanation_zh": found.get("explanation_zh")}


def procurement_report_context(pilot: Pilot) -> dict[str, Any]:
    gates, evaluations, attachments, missing = [], {}, [], []
    taken: set[str] = set()
    for gate in pilot.gates.order_by("number"):
        evaluation = gate.latest_evaluation
        item = {"gate": gate_context(gate), "evaluation": None, "verdict": {}, "signoffs": [], "history": [],
                "history_summary": history_summary([])}
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
            item["history"] = gate_history(gate, evaluation)
            item["history_summary"] = history_summary(item["history"])
        gates.append(item)
    plan_signoffs = [signoff_context(s) for s in
                     SignOff.objects.filter(pilot=pilot, plan_version__isnull=False).select_related("person", "plan_version")]
    inventory = inventories(pilot, evaluations[1].result if 1 in evaluations else None)
    simulated = (any(e.simulated or (e.result or {}).get("simulated") for e in evaluations.values())
                 or any(a["simulated"] for a in attachments) or any(i.get("simulated") for i in inventory))
    g4 = evaluations.get(4)
    return {
        "kind": "procurement", "simulated": simulated, "pilot": pilot_context(pilot), "gate": None, "gates": gates,
        "decision": decision(pilot), "recompute": recompute_speedup(evaluations, pilot.customer_concurrency),
        "trace": (trace_of_job(g4.job, with_reuse=True) if g4 is not None else None),
        "plan_signoffs": plan_signoffs, "inventory": inventory,
        "projections": projections(evaluations, pilot.customer_concurrency,
                                   customer_trace=bool(g4 is not None and (trace_of_job(g4.job) or {}).get("customer"))),
        "sizing": sizing(pilot, evaluations.get(4)), "attachments": attachments, "missing_inputs": missing,
        "capacity_check": capacity_check(evaluations.get(4)),
        "tier_shares": tier_share_table(g4), "predicted_vs_measured": predicted_vs_measured(g4, pilot),
        "signing": signing_context(), "evaluation": None, "verdict": {},
        "plan_sha256": (pilot.signed_plan.sha256 if pilot.signed_plan else ""),
    }


def read_attachment(item: dict[str, Any]) -> bytes:
    """The bytes of one listed attachment, from the context or the evidence store (hashed again)."""
    if "data" in item:
        return item["data"]
    return get_bytes(item["storage_name"], item["sha256"])
