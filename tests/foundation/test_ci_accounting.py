"""What `make test` records of its own cost: every test's CPU seconds (tests/conftest.py), counting the processes it
started and reaped, and benchmarks/ci/by_file.py's sums of them per file."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.ci.by_file import by_file
from tests.conftest import _cpu_seconds


def test_a_reaped_childs_cpu_counts_in_the_tests_cpu_seconds():
    before = _cpu_seconds()
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
                    "while time.process_time() < end: pass"], check=True)
    assert _cpu_seconds() - before >= 0.45


def test_by_file_sums_wall_and_cpu_seconds_per_file(tmp_path: Path):
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.demo.test_demo_pipeline" name="a" time="10.5">'
        '<properties><property name="cpu_s" value="4.25" /></properties></testcase>'
        '<testcase classname="tests.demo.test_demo_pipeline" name="b" time="1.5">'
        '<properties><property name="cpu_s" value="0.75" /></properties></testcase>'
        '<testcase classname="tests.judge.test_lazy_imports" name="c" time="2" /></testsuite></testsuites>')
    seconds, tests, cpu = by_file(report)
    assert seconds == {"tests/demo/test_demo_pipeline.py": 12.0, "tests/judge/test_lazy_imports.py": 2.0}
    assert tests == {"tests/demo/test_demo_pipeline.py": 2, "tests/judge/test_lazy_imports.py": 1}
    assert cpu == {"tests/demo/test_demo_pipeline.py": 5.0}
