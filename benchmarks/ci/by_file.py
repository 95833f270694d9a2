"""Where `make test`'s time goes: the seconds of every test file (set-up, call and tear-down of its tests, as the
JUnit report of a run records them), largest first, with their sum and what that sum means on N parallel sessions.

    .venv/bin/python benchmarks/ci/by_file.py var/test-report.xml [--top 25] [--workers 3]

The sum over N sessions is the least wall time the run can take with that split; a run much longer than it has a
tail (a long file handed out last) or waits on something outside the tests.
"""
from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path


def by_file(report: Path) -> tuple[collections.Counter, collections.Counter]:
    seconds: collections.Counter = collections.Counter()
    tests: collections.Counter = collections.Counter()
    for case in ET.parse(report).iter("testcase"):
        parts = (case.get("classname") or "?").split(".")
        name = "/".join(parts) + ".py" if parts[0] == "tests" else ".".join(parts)
        seconds[name] += float(case.get("time") or 0)
        tests[name] += 1
    return seconds, tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--workers", type=int, default=3)
    args = parser.parse_args()
    seconds, tests = by_file(args.report)
    total = sum(seconds.values())
    print(f"{sum(tests.values())} tests in {len(seconds)} files: {total:,.0f} s in all, "
          f"{total / args.workers / 60:.1f} min on {args.workers} sessions at the least")
    for name, value in seconds.most_common(args.top):
        print(f"{value:8.0f} s  {value / total:5.1%}  {tests[name]:4d} tests  {name}")


if __name__ == "__main__":
    main()
