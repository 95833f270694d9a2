"""The report step of a gate run: after the verdict, the gate report is written (reports.service).

It is a step kind of the reports app, registered by ReportsConfig.ready() with runners.kinds: the engine
(runners) reaches it through its kind registry and never imports this floor; gate plans place it by name.

One import stays inside a function, on purpose: run_report imports reports.service when a report is
written. Every process registers the step kinds at start, and the report service brings WeasyPrint and
pyHanko, about two seconds of import that the web process, the commands and most workers never need.
"""
from __future__ import annotations

from gates.models import Evaluation, Report
from runners.kinds import StepContext, StepError, StepKind


def run_report(ctx: StepContext) -> dict:
    evaluate = ctx.sibling(ctx.step.params["after_verdict"][0])
    evaluation = Evaluation.objects.filter(pk=(evaluate.result or {}).get("evaluation")).first()
    if evaluation is None:
        evaluation = Evaluation.objects.filter(job=ctx.job).order_by("-pk").first()
    if evaluation is None:
        raise StepError("no evaluation to report on")
    language = ctx.step.params.get("language", "en")
    done = Report.objects.filter(evaluation=evaluation, kind=Report.Kind.GATE, language=language).first()
    if done is not None:  # an earlier attempt wrote it before its worker died
        return {"report": str(done.code), "path": done.path, "sha256": done.sha256}
    from reports.service import create_gate_report  # see the module docstring

    try:
        report = create_gate_report(evaluation.gate, evaluation, language=language, who="orchestrator")
    except Exception as exc:  # noqa: BLE001 — a report failure must not hide the recorded verdict
        raise StepError(f"the gate report could not be produced ({type(exc).__name__}: {exc}); "
                        "the verdict is recorded") from None
    return {"report": str(report.code), "path": report.path, "sha256": report.sha256}


REPORT_KINDS = [StepKind("report", run=run_report, soft_time_limit=900, affects_status=False)]
"""The kinds of step the reports app adds to a gate run; ReportsConfig.ready() registers them."""
