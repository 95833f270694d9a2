"""The exported files name the verdict and plan version of the run, and the CSV carries the verdict's own figures."""
from __future__ import annotations

import csv
import io
import json

from gates.models import Evaluation
from reports import exports
from runners.artifacts import store_bytes
from runners.models import Job

CRITERION = {"key": "g3-ttft-vs-local", "candidate": "fx", "baseline": "local_nvme", "phase": "measure",
             "unit": "fraction", "verdict": "pass", "value": 0.2596, "ci": [0.22, 0.30],
             "cells": [{"concurrency": 8, "value": 0.2596, "ci": [0.22, 0.30], "verdict": "pass"},
                       {"concurrency": 16, "value": 0.31, "ci": [0.25, 0.37], "verdict": "pass"}]}


def _line(i: int) -> str:
    return json.dumps({"schema": "fxpilot.request/1", "run_id": "r", "arm": "fx", "instance": "n1", "phase": "measure",
                       "concurrency": 8, "repetition": 1, "session": f"s{i}", "prompt_tokens": 10, "cached_tokens": 0,
                       "output_tokens": 2, "t_send": float(i), "t_first_token": i + 0.5, "t_end": i + 1.0,
                       "wall_anchor": 0.0, "status": "ok", "error": None, "simulated": False}) + "\n"


def test_files_name_the_verdict_and_plan_version_and_the_csv_equals_the_verdicts_figures(signed_pilot, tmp_path):
    pilot = signed_pilot.pilot
    job = Job.objects.create(pilot=pilot, gate=pilot.gate(3))
    store_bytes(job, "node1/records.jsonl", "".join(_line(i) for i in range(3)).encode(), kind="records")
    Evaluation.objects.create(gate=pilot.gate(3), job=job, plan_version=pilot.signed_plan, verdict="pass",
                              result={"criteria": [CRITERION]}, inputs={}, simulated=False)
    [summary_path, _] = exports.export(job, "aiperf", tmp_path / "a")
    label = json.loads(summary_path.read_text())["fxpilot"]
    assert (label["evidence"], label["verdict"], label["plan_version"]) == ("measured", "pass", pilot.signed_plan.number)
    [report_path] = exports.export(job, "llm-d", tmp_path / "l")
    stack = json.loads(report_path.read_text())["scenario"]["stack"]
    ours = next(c for c in stack if c["metadata"]["label"] == "fxpilot-fx")["standardized"]
    assert (ours["evidence"], ours["verdict"], ours["plan_version"]) == ("measured", "pass", pilot.signed_plan.number)
    [csv_path] = exports.export(job, "csv", tmp_path / "c")
    rows = [r for r in csv.DictReader(io.StringIO(csv_path.read_text())) if r["metric"].startswith("criterion:")]
    assert [(r["concurrency"], float(r["value"]), float(r["ci_low"]), float(r["ci_high"]), r["cell_verdict"])
            for r in rows] == [("8", 0.2596, 0.22, 0.30, "pass"), ("16", 0.31, 0.25, 0.37, "pass")]
    assert {r["verdict"] for r in rows} == {"pass"} and {r["evidence"] for r in rows} == {"measured"}
