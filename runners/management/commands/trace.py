"""`manage.py trace analyze FILE …` and `manage.py trace sample FILE …` (issue 24; docs/traces.md).

analyze: the format (detected unless --format), requests, tokens, duration, sessions and the reuse a cache
could get — unbounded and LRU at each --capacity-tokens — counted as vLLM's prefix cache counts.
sample: whole sessions chosen for a G4 replay, written as fxpilot's replay CSV (with block ids), and what was
chosen (shares, rates, prompts cut or left out) as JSON on stdout.

A bad file exits 1 naming the file, the format, the line and the field, and writes nothing.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from gates.traces.analysis import analyse, report
from gates.traces.formats import FORMATS, TraceFormatError, bounded_heap, read_trace
from gates.traces.sample import choose, replay_csv


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise CommandError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise CommandError(f"{text} must be ≥ 1")
    return value


class Command(BaseCommand):
    help = "Analyse a serving trace's reuse, or sample it for a G4 replay (docs/traces.md)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        analyze = sub.add_parser("analyze", help="requests, tokens, sessions and the reuse a cache could get")
        self._common(analyze)
        analyze.add_argument("--capacity-tokens", action="append", default=[], type=str, metavar="N",
                             help="an LRU cache of N tokens (repeat once per capacity)")
        analyze.add_argument("--json", action="store_true", help="print the analysis as JSON")
        sample = sub.add_parser("sample", help="whole sessions for a G4 replay, as fxpilot's replay CSV")
        self._common(sample)
        how = sample.add_mutually_exclusive_group()
        how.add_argument("--ratio", type=float, help="share of the sessions, chosen by a hash of their names")
        how.add_argument("--window", nargs=2, type=float, metavar=("START_S", "END_S"),
                         help="the sessions whose first request arrives in [START_S, END_S)")
        sample.add_argument("--seed", type=int, default=20260629)
        sample.add_argument("--speedup", type=float, default=1.0)
        sample.add_argument("--idle-gap-cap-s", type=float)
        sample.add_argument("--max-model-len", type=int)
        sample.add_argument("--over-length", choices=("cut", "out"), default="cut")
        sample.add_argument("--max-requests", type=int)
        sample.add_argument("--out", required=True, help="the replay CSV to write")

    @staticmethod
    def _common(parser):
        parser.add_argument("file")
        parser.add_argument("--format", choices=sorted(FORMATS), help="skip detection")
        parser.add_argument("--block-tokens", type=str, help="tokens per block id (default 512)")

    def handle(self, *args, action, file, **options):
        block_tokens = _positive_int(options["block_tokens"]) if options.get("block_tokens") else None
        bounded_heap()
        try:
            trace = read_trace(file, options.get("format"), block_tokens=block_tokens, name=file)
        except TraceFormatError as error:
            raise CommandError(str(error)) from None
        analysis = analyse(trace)
        if action == "analyze":
            capacities = tuple(_positive_int(c) for c in options["capacity_tokens"])
            result = report(analysis, capacities)
            if options["json"]:
                self.stdout.write(json.dumps(result, indent=1))
            else:
                self.stdout.write(describe(result))
            return
        try:
            sample = choose(analysis, ratio=options["ratio"], window=tuple(options["window"]) if options["window"]
                            else None, seed=options["seed"], speedup=options["speedup"],
                            idle_gap_cap_s=options["idle_gap_cap_s"], max_model_len=options["max_model_len"],
                            over_length=options["over_length"], max_requests=options["max_requests"])
        except ValueError as error:
            raise CommandError(str(error)) from None
        out = Path(options["out"])
        with tempfile.NamedTemporaryFile("w", dir=out.parent or ".", delete=False, suffix=".part") as handle:
            handle.write(replay_csv(sample))
        os.replace(handle.name, out)
        self.stdout.write(json.dumps(sample.stats, indent=1))


def describe(result: dict) -> str:
    """The analysis in a few lines for people."""
    lines = [f"{result['file']}: {result['format_name']}",
             f"  {result['requests']:,} requests in {result['sessions']:,} sessions ({result['sessions_basis']}), "
             f"{result['duration_s']:,.1f} s",
             f"  input {result['input_tokens']:,} tokens, output {result['output_tokens']:,} tokens"]
    reuse = result["reuse"]
    if not reuse["known"]:
        lines.append(f"  reuse unknown: {reuse['reason']}")
    else:
        lines.append(f"  ideal hit fraction {reuse['ideal_hit_fraction']:.4f} ({reuse['block_tokens']}-token blocks)")
        for row in reuse["lru"]:
            lines.append(f"  LRU {row['capacity_tokens']:,} tokens: hit fraction {row['hit_fraction']:.4f}")
        lines.append(f"  {reuse['summary']}")
    return "\n".join(lines)
