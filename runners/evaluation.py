"""The judge meets the database: a job's artifacts and its pilot's signed plan in, an Evaluation out.

Gate states are not touched here; gates.lifecycle.record_verdict does that with the Evaluation.
"""
from __future__ import annotations

from gates import judge
from gates.models import Evaluation, PlanTamperedError
from runners.artifacts import read_artifact
from runners.models import Artifact, Job

JUDGED_KINDS = ("records", "retrieve", "inventory", "phase-summary", "replay-sample")
__all__ = ["JUDGED_KINDS", "PlanTamperedError", "ReplayMismatch", "evaluate_job", "replay_evaluation", "replays_identically"]


class ReplayMismatch(Exception):
    """The stored inputs are gone or changed: the evaluation cannot be replayed."""


def _files(artifacts: list[Artifact]) -> list[tuple[str, bytes]]:
    return [(artifact.name, read_artifact(artifact)) for artifact in artifacts]


def evaluate_job(job: Job) -> Evaluation:
    """Judge the job's gate on its artifacts with the signed plan; store and return the Evaluation.

    Raises judge.RecordError on input the judge cannot use (nothing is stored then),
    runners.artifacts.ArtifactMismatch when a stored file no longer hashes to its name, and
    gates.models.PlanTamperedError when the plan's rows no longer hash to the signed SHA-256.
    """
    if job.gate_id is None:
        raise ValueError(f"{job} judges no gate")
    version = job.pilot.signed_plan
    if version is None:
        raise ValueError(f"{job.pilot} has no signed plan to judge against")
    # The rows are hashed again and compared with what both parties signed; a changed plan is not judged.
    plan = version.verified_plan()
    # What teardown kept after an error or a cancel (Artifact.outcome) is evidence of what happened, never judged.
    artifacts = list(job.artifacts.filter(kind__in=JUDGED_KINDS, outcome="").order_by("name"))
    result = judge.evaluate(plan, job.gate.number, _files(artifacts), planned=_planned(job),
                            prior_runs=prior_runs(job))
    return Evaluation.objects.create(
        gate=job.gate, job=job, plan_version=version, verdict=result["verdict"], result=result,
        inputs={artifact.name: artifact.sha256 for artifact in artifacts}, simulated=result["simulated"],
    )


def prior_runs(job: Job) -> int:
    """Earlier runs of the job's gate that were judged (pass, marginal or fail; an invalid run decided nothing):
    a gate's runs share one error budget (docs/judge.md, "One error budget per gate")."""
    judged = Evaluation.objects.filter(gate_id=job.gate_id, job__isnull=False, pk__lt=_next_pk(job)) \
        .exclude(job_id=job.pk).exclude(verdict="invalid").values_list("job_id", flat=True).distinct()
    return len(set(judged))


def _next_pk(job: Job) -> int:
    """Evaluations stored before this job's first one (a replay counts the runs its evaluation counted)."""
    first = Evaluation.objects.filter(job_id=job.pk).order_by("pk").values_list("pk", flat=True).first()
    return first if first is not None else 2 ** 62


def _planned(job: Job) -> int | None:
    """The repetitions the run was started with (its parameters may set fewer or more than the plan):
    repetitions beyond them are extensions, each judged at its spent level (docs/judge.md)."""
    value = (job.params or {}).get("repetitions")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def replay_evaluation(evaluation: Evaluation) -> dict:
    """Judge the stored inputs again with the stored plan version; the result equals evaluation.result when
    the same judge version judges. A newer judge gives its own verdict and says so under `rejudged`; the
    stored evaluation is never changed."""
    if evaluation.job_id is None:
        raise ReplayMismatch(f"evaluation {evaluation.pk} has no job, so its artifacts cannot be found")
    names = sorted(evaluation.inputs)
    artifacts = {a.name: a for a in evaluation.job.artifacts.filter(name__in=names)}
    for name in names:
        artifact = artifacts.get(name)
        if artifact is None:
            raise ReplayMismatch(f"input {name} is no longer among the job's artifacts")
        if artifact.sha256 != evaluation.inputs[name]:
            raise ReplayMismatch(f"input {name} is now {artifact.sha256}, the evaluation used {evaluation.inputs[name]}")
    plan = evaluation.plan_version.verified_plan()
    result = judge.evaluate(plan, evaluation.gate.number, _files([artifacts[name] for name in names]),
                            planned=_planned(evaluation.job), prior_runs=prior_runs(evaluation.job))
    stored = (evaluation.result or {}).get("judge_version")
    if stored != result["judge_version"]:
        result["rejudged"] = {
            "stored_judge_version": stored, "judge_version": result["judge_version"],
            "stored_verdict": evaluation.verdict,
            "note": f"judged again by judge version {result['judge_version']}; evaluation {evaluation.pk} keeps "
                    f"its verdict '{evaluation.verdict}' of judge version {stored}",
        }
    return result


def replays_identically(evaluation: Evaluation) -> bool:
    """The stored verdict, judged again by the same judge version, is byte for byte the same."""
    return judge.canonical_json(replay_evaluation(evaluation)) == judge.canonical_json(evaluation.result)


def extension_history(evaluation: Evaluation | None) -> dict | None:
    """Whether the run behind an evaluation was extended, how often and why: every earlier marginal
    judgement of the same run was followed by more repetitions (docs/judge.md, "Extension")."""
    if evaluation is None or evaluation.job_id is None:
        return None
    earlier = list(Evaluation.objects.filter(job_id=evaluation.job_id, pk__lt=evaluation.pk).order_by("pk"))
    marginal = [e for e in earlier if e.verdict == "marginal"]
    extension = (evaluation.result or {}).get("extension") or {}
    times = max(len(marginal), int(extension.get("extensions") or 0))
    if not times:
        return None
    why = [{"evaluation": e.pk, "criteria": [c["key"] for c in (e.result or {}).get("criteria", [])
                                             if c.get("verdict") == "marginal"]} for e in marginal]
    return {"times": times, "why": why, "keys": sorted({k for w in why for k in w["criteria"]}),
            "repetitions": extension.get("repetitions"), "planned": extension.get("planned_repetitions"),
            "confidence": extension.get("confidence")}
