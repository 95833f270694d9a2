"""Prompts are token ids that depend only on (seed, session, length): the same context on every arm,
node, Python version and phase."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runners.remote import workload
from tests.client.conftest import CLIENT, ROOT


def test_a_session_context_is_the_same_in_another_process():
    here = hashlib.sha256(workload.make_sessions(3, 5000, seed=7, prefix="x")[2].context_json).hexdigest()
    code = (f"import hashlib, sys; sys.path.insert(0, {str(CLIENT.parent)!r}); import workload; "
            "print(hashlib.sha256(workload.make_sessions(3, 5000, seed=7, prefix='x')[2].context_json).hexdigest())")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == here


def test_sessions_differ_and_ids_stay_in_the_ordinary_range():
    a, b = workload.make_sessions(2, 2000)
    assert a.context_ids() != b.context_ids()
    ids = a.context_ids()
    assert len(ids) == 2000 and min(ids) >= workload.TOKEN_BASE and max(ids) < workload.TOKEN_BASE + workload.TOKEN_SPAN


def test_a_shorter_stream_is_a_prefix_of_a_longer_one():
    for short in (1, 2, 3, 999):
        assert workload.token_ids("k", short) == workload.token_ids("k", 1001)[:short]


def test_a_returning_session_sends_its_context_then_the_new_turn():
    session = workload.make_sessions(1, 300)[0]
    req = workload.measure_requests([session], output_tokens=4, turn_tokens=20, concurrency=1, repetition=2)[0]
    sent = [int(v) for v in req.prompt_json.split(b",")]
    assert sent[:300] == session.context_ids() and sent[300:] == session.turn_ids("measure:1:2", 20)
    assert req.prompt_tokens == 320


def test_plan_values_become_flags():
    plan = yaml.safe_load((ROOT / "gates" / "plans" / "default.yaml").read_text())["workloads"]
    flags = workload.plan_args("cold-recovery", plan)
    wanted = plan["cold_recovery"]
    assert flags[flags.index("--prompt-tokens") + 1] == str(wanted["prompt_tokens"])
    assert flags[flags.index("--repetitions") + 1] == str(wanted["repetitions"])
    args = workload.build_parser().parse_args(["cold-recovery", "--url", "http://h:1", "--arm", "fx", "--out", "x",
                                               *flags])
    assert args.requests_per_client == wanted["requests_per_client"]
    soak = workload.plan_args("soak", plan)
    assert soak[soak.index("--duration-s") + 1] == str(float(plan["soak"]["hours"]) * 3600)


def test_the_client_runs_on_the_oldest_python3_a_node_may_have(server_url, tmp_path):
    oldest = sorted(Path("/root/.pyenv/versions").glob("3.8*/bin/python")) + [Path("/usr/bin/python3.8")]
    python = next((p for p in oldest if p.exists()), None)
    if python is None:
        pytest.skip("no Python 3.8 on this machine")
    out = tmp_path / "fx.jsonl"
    result = subprocess.run([str(python), str(CLIENT), "cold-recovery", "--url", server_url, "--arm", "fx", "--out",
                             str(out), "--prompt-tokens", "64", "--turn-tokens", "8", "--output-tokens", "4", "-c", "2",
                             "--repetitions", "1", "--evict", "reset"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert len(out.read_text().splitlines()) == 4 + 4
