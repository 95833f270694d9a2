"""`manage.py judge --plan default --gate G3 FILE…`: the judge on files, without the database.
`manage.py judge --plan default --power [--spread 0.06]`: the sample-size planner for a plan."""
from __future__ import annotations

import json
import textwrap

from django.core.management.base import BaseCommand, CommandError

from gates.judge import RecordError, canonical_json, evaluate, planner
from gates.plan import PlanError, load_plan


class Command(BaseCommand):
    help = ("Judge one gate of a plan on record files (fxpilot.request/1 JSONL, vllm bench serve --save-detailed JSON, "
            "fxpilot.retrieve/1, fxpilot.phase/1 summaries, fxpilot.inventory/1) and print the verdict. "
            "Exit 0 whatever the verdict; non-zero on input the judge cannot use.")
    requires_system_checks: list = []
    requires_migrations_checks = False

    def add_arguments(self, parser) -> None:
        parser.add_argument("files", nargs="*", metavar="FILE")
        parser.add_argument("--plan", default="default", help="a plan name (gates/plans/NAME.yaml) or a path")
        parser.add_argument("--gate", help="G1, G2, G3 or G4")
        parser.add_argument("--power", action="store_true",
                            help="print the sample-size planner's figures for the plan instead of judging files")
        parser.add_argument("--spread", type=float, default=None,
                            help="with --power: the CV across repetitions to plan for (e.g. measured at G1); "
                                 "default the plan's planning.spread")
        parser.add_argument("--repetitions", type=int, default=None, metavar="N",
                            help="the repetitions the run was started with, when it set its own (its looks are the "
                                 "plan's below N and N); default the plan's looks")
        parser.add_argument("--prior-runs", type=int, default=0, metavar="N",
                            help="how many earlier runs of this gate were judged: the gate's runs share one error "
                                 "budget (judging.runs)")
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
        if options["power"]:
            try:
                plan = load_plan(options["plan"])
            except PlanError as error:
                raise CommandError(str(error)) from None
            spread = options["spread"]
            if spread is not None and not 0 < spread < 1:
                raise CommandError(f"--spread {spread:g}: give a coefficient of variation between 0 and 1, e.g. 0.06")
            figures = planner.summary(plan, spread=spread)
            if options["format"] == "json":
                self.stdout.write(json.dumps(figures, sort_keys=True, ensure_ascii=False))
            else:
                self.stdout.write(render_power(figures))
            return
        if not options["gate"] or not options["files"]:
            raise CommandError("give --gate G1…G4 and the files to judge (or --power for the planner)")
        try:
            plan = load_plan(options["plan"])
            if options["repetitions"] is not None and options["repetitions"] < 1:
                raise CommandError("--repetitions: give a whole number ≥ 1")
            if options["prior_runs"] < 0:
                raise CommandError("--prior-runs: give a whole number ≥ 0")
            verdict = evaluate(plan, options["gate"], options["files"], expect=expect, planned=options["repetitions"],
                               prior_runs=options["prior_runs"])
        except (PlanError, RecordError, ValueError) as error:
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
             verdict["explanation"]]
    design = verdict.get("sequential")
    if design:
        lines.append(f"look {design['look']} of {design['of']} (looks at {', '.join(map(str, design['looks']))} "
                     f"repetitions; {design['repetitions_judged']} judged of {design['repetitions']} recorded), run "
                     f"{design['run']} of {design['runs']}; intervals at {design['confidence'] * 100:.4g} %; error "
                     f"spent {design['alpha_spent'] * 100:.3g} % of {design['alpha'] * 100:.3g} % per cell"
                     + ("" if design["final"] or verdict["verdict"] != "marginal" else
                        f" — marginal: continue to look {design['look'] + 1}"))
    lines.append("")
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


def render_power(figures: dict) -> str:
    """The planner's figures for people: per criterion what it needs, per gate the repetitions and GPU time."""
    lines = [f"Sample-size planner — spread {figures['spread']:.0%} across repetitions ({figures['spread_source']}), "
             f"power {figures['power']:.0%} on the published figures", ""]
    header = f"{'gate':<5} {'criterion':<26} {'kind':<11} {'needs':>6} {'power as planned':>17}  note"
    lines += [header, "-" * len(header)]
    for c in figures["criteria"]:
        needs = "" if c["repetitions_needed"] is None else str(c["repetitions_needed"])
        power = "" if c["power_at_plan"] is None else f"{c['power_at_plan']:.0%}"
        flag = "" if c["decidable"] else "  ← cannot reach a decision as planned"
        lines.append(f"G{c['gate']:<4} {c['key']:<26} {c['kind']:<11} {needs:>6} {power:>17}  {c['note']}{flag}")
    lines += ["", f"{'gate':<5} {'planned':>8} {'needed':>7} {'GPU-h/rep':>10} {'GPU-h max':>10} {'joint power':>12} "
                  f"{'median reps':>12} {'GPU-h expected':>15} {'GPU-h p90':>10}  unreachable"]

    def cell(v, fmt="{:g}"):
        return "—" if v is None else fmt.format(v)
    for g in figures["gates"]:
        lines.append(f"G{g['gate']:<4} {g['planned_repetitions']:>8} {cell(g['repetitions_needed']):>7} "
                     f"{cell(g['gpu_hours_per_repetition']):>10} {cell(g['gpu_hours_planned']):>10} "
                     f"{cell(g.get('power_joint'), '{:.1%}'):>12} {cell(g.get('median_repetitions')):>12} "
                     f"{cell(g.get('gpu_hours_expected')):>15} {cell(g.get('gpu_hours_p90')):>10}  "
                     + (", ".join(g.get("unreachable") or []) or "none"))
    lines.append("")
    lines.append("FLAGGED: " + ", ".join(figures["flagged"]) if figures["flagged"]
                 else "Every criterion can reach a decision as planned.")
    return "\n".join(lines)
