"""`manage.py judge --plan default --gate G3 FILE…`: the judge on files, without the database."""
from __future__ import annotations

import textwrap

from django.core.management.base import BaseCommand, CommandError

from gates.judge import RecordError, canonical_json, evaluate
from gates.plan import PlanError, load_plan


class Command(BaseCommand):
    help = ("Judge one gate of a plan on record files (fxpilot.request/1 JSONL, vllm bench serve --save-detailed JSON, "
            "fxpilot.retrieve/1, fxpilot.phase/1 summaries, fxpilot.inventory/1) and print the verdict. "
            "Exit 0 whatever the verdict; non-zero on input the judge cannot use.")
    requires_system_checks: list = []
    requires_migrations_checks = False

    def add_arguments(self, parser) -> None:
        parser.add_argument("files", nargs="+", metavar="FILE")
        parser.add_argument("--plan", default="default", help="a plan name (gates/plans/NAME.yaml) or a path")
        parser.add_argument("--gate", required=True, help="G1, G2, G3 or G4")
        parser.add_argument("--format", choices=["json", "table"], default="json")
        parser.add_argument("--expect", action="append", default=[], metavar="KEY=VALUE",
                            help="override one of the plan's expectations, e.g. gpu_model=MI300X")

    def handle(self, *args, **options) -> None:
        expect = {}
        for item in options["expect"]:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise CommandError(f"--expect {item!r}: write KEY=VALUE")
            expect[key] = value
        try:
            plan = load_plan(options["plan"])
            verdict = evaluate(plan, options["gate"], options["files"], expect=expect)
        except (PlanError, RecordError) as error:
            raise CommandError(str(error)) from None
        except KeyError as error:
            raise CommandError(error.args[0] if error.args else str(error)) from None
        if options["format"] == "json":
            self.stdout.write(canonical_json(verdict))
        else:
            self.stdout.write(render_table(verdict))


def render_table(verdict: dict) -> str:
    """The verdict for people: one line per criterion and cell, then validity and the explanations."""
    lines = [f"G{verdict['gate']}: {verdict['verdict'].upper()}" + ("   [SIMULATED]" if verdict["simulated"] else ""),
             verdict["explanation"], ""]
    header = f"{'criterion':<24} {'conc':>5} {'value':>11} {'interval':>25} {'bar':>10} {'n':>7}  verdict"
    lines += [header, "-" * len(header)]
    for criterion in verdict["criteria"]:
        bar = f"{criterion['op']} {criterion['threshold']:g}"
        for cell in criterion["cells"] or [criterion]:
            level = cell.get("concurrency", cell.get("node", ""))
            ci = cell.get("ci") or [None, None]
            span = f"[{_n(ci[0])}, {_n(ci[1])}]"
            n = int(cell.get("n_candidate") or 0) + int(cell.get("n_baseline") or 0) if "node" not in cell else 1
            lines.append(f"{criterion['key']:<24} {'' if level is None else level!s:>5} {_n(cell.get('value')):>11} "
                         f"{span:>25} {bar:>10} {n:>7}  {cell.get('verdict', '')}")
    lines += ["", "validity:"]
    for check in verdict["validity"]["checks"]:
        lines.append(f"  [{'ok' if check['ok'] else 'FAIL'}] {check['name']}: {check['detail']}")
    lines.append("")
    for criterion in verdict["criteria"]:
        lines += textwrap.wrap(f"{criterion['key']} — {criterion['verdict']}: {criterion['explanation']}", 110,
                               subsequent_indent="    ")
    return "\n".join(lines)


def _n(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"
