"""Where `make test`'s time goes: the seconds of every test file (set-up, call and tear-down of its tests, as the
JUnit report of a run records them), largest first, with their sum and what that sum means on N parallel sessions;
and the CPU seconds each file cost (the `cpu_s` property tests/conftest.py records: the session's own CPU and that of
the processes its tests started and reaped), which is what a loaded runner runs short of. `--by cpu` sorts by those.

    .venv/bin/python benchmarks/ci/by_file.py var/test-report.xml [--top 25] [--workers 3]

The sum over N sessions is the least wall time the run can take with that split; a run much longer than it has a
tail (a long file handed out last) or waits on something outside the tests.
"""
from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path


def by_file(report: Path) -> tuple[collections.Counter, collections.Counter, collections.Counter]:
    """Per test file: wall seconds, tests, CPU seconds."""
    seconds: collections.Counter = collections.Counter()
    tests: collections.Counter = collections.Counter()
    cpu: collections.Counter = collections.Counter()
    for case in ET.parse(report).iter("testcase"):
        parts = (case.get("classname") or "?").split(".")
        name = "/".join(parts) + ".py" if parts[0] == "tests" else ".".join(parts)
        seconds[name] += float(case.get("time") or 0)
        tests[name] += 1
        for prop in case.iter("property"):
            if prop.get("name") == "cpu_s":
                cpu[name] += float(prop.get("value") or 0)
    return seconds, tests, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--by", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    seconds, tests, cpu = by_file(args.report)
    total, total_cpu = sum(seconds.values()), sum(cpu.values())
    print(f"{sum(tests.values())} tests in {len(seconds)} files: {total:,.0f} s in all, "
          f"{total / args.workers / 60:.1f} min on {args.workers} sessions at the least; "
          f"{total_cpu:,.0f} CPU-s recorded")
    print(f"{'wall s':>8}  {'share':>5}  {'CPU-s':>7}  {'share':>5}  tests  file")
    for name, _ in (cpu if args.by == "cpu" else seconds).most_common(args.top):
        print(f"{seconds[name]:8.0f}  {seconds[name] / total:5.1%}  {cpu[name]:7.0f}  "
              f"{cpu[name] / (total_cpu or 1):5.1%}  {tests[name]:5d}  {name}")


if __name__ == "__main__":
    main()
