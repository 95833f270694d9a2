"""manage.py judge: runs on files without the database, prints the verdict, exits 0 whatever the verdict."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gates.judge import synthetic

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, files: list[tuple[str, bytes]]) -> list[str]:
    paths = []
    for name, data in files:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        paths.append(str(path))
    return paths


def judge(*args: str) -> subprocess.CompletedProcess:
    # an unreachable database: the command must not need one
    env = {**os.environ, "DATABASE_URL": "postgres://nobody:x@127.0.0.1:9/none", "FXPILOT_ENV": "test"}
    return subprocess.run([sys.executable, "manage.py", "judge", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize(("slowdown", "expected"), [(None, "pass"), ({"fx": 1.3}, "fail")])
def test_it_prints_the_verdict_json_and_exits_zero_whatever_the_verdict(tmp_path, slowdown, expected):
    paths = write(tmp_path, synthetic.gate_inputs(3, slowdown=slowdown))
    done = judge("--plan", "default", "--gate", "G3", *paths)
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["schema"] == "fxpilot.verdict/1" and verdict["verdict"] == expected
    assert set(verdict["inputs"]) == set(paths)


def test_the_table_format_is_for_people(tmp_path):
    done = judge("--gate", "G1", "--format", "table", *write(tmp_path, synthetic.gate_inputs(1)))
    assert done.returncode == 0, done.stderr
    assert "G1: PASS   [SIMULATED]" in done.stdout and "g1-baseline-stable" in done.stdout
    assert "[ok] versions-recorded" in done.stdout


def test_bad_input_exits_non_zero_naming_file_line_and_field(tmp_path):
    records = synthetic.records(synthetic.gate_frames(3))[:5]
    records[2]["t_send"] = "soon"
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    done = judge("--gate", "G3", str(tmp_path / "r.jsonl"))
    assert done.returncode != 0 and done.stdout == ""
    assert "r.jsonl, line 3, field 't_send'" in done.stderr


def test_an_unknown_gate_or_plan_is_refused(tmp_path):
    paths = write(tmp_path, synthetic.gate_inputs(3))
    assert "not a gate" in judge("--gate", "G7", *paths).stderr
    assert "no plan file" in judge("--plan", "nosuch", "--gate", "G3", *paths).stderr


def bench_files(frame) -> list[tuple[str, bytes]]:
    """One `vllm bench serve --save-result --save-detailed --metadata arm=… repetition=…` JSON per cell."""
    files = []
    for (arm, level, rep), cell in frame.groupby(["arm", "concurrency", "repetition"]):
        result = {"backend": "openai", "max_concurrency": int(level), "num_prompts": len(cell), "arm": arm,
                  "repetition": str(rep), "start_times": cell["t_send"].tolist(),
                  "ttfts": (cell["t_first_token"] - cell["t_send"]).tolist(),
                  "latencies": (cell["t_end"] - cell["t_send"]).tolist(), "input_lens": cell["prompt_tokens"].tolist(),
                  "output_lens": cell["output_tokens"].tolist(), "errors": [""] * len(cell), "simulated": "true"}
        files.append((f"bench/{arm}-c{level}-r{rep}.json", json.dumps(result).encode()))
    return files


def test_vllm_bench_detailed_files_are_judged_with_their_phase_summaries(tmp_path):
    frame = synthetic.gate_frames(3)
    extra = [("records.summary.json", synthetic.jsonl(synthetic.phase_summaries(frame))),
             ("node1/inventory.json", synthetic.jsonl([synthetic.inventory()]))]
    done = judge("--gate", "G3", *write(tmp_path, bench_files(frame) + extra))
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["verdict"] == "pass", verdict["explanation"]
    assert verdict["counts"]["requests"] == len(frame)


def test_vllm_bench_files_alone_cannot_show_cache_behaviour(tmp_path):
    frame = synthetic.gate_frames(3)
    files = bench_files(frame) + [("node1/inventory.json", synthetic.jsonl([synthetic.inventory()]))]
    done = judge("--gate", "G3", *write(tmp_path, files))
    assert done.returncode == 0 and json.loads(done.stdout)["verdict"] == "invalid"
