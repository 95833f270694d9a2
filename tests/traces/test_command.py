"""`manage.py trace analyze` as the issue states it: the JSON fields, the reuse unknown, a bad file."""
from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from gates.traces import reference
from tests.traces.helpers import mooncake_lines, random_requests, write

ROOT = Path(__file__).resolve().parents[2]


def analyze(*args) -> dict:
    out = StringIO()
    call_command("trace", "analyze", *map(str, args), "--json", stdout=out)
    return json.loads(out.getvalue())


def test_analyze_json_has_the_issues_fields_counted_by_the_definitions(tmp_path):
    requests = random_requests(11, 512)
    path = write(tmp_path, "trace.jsonl", mooncake_lines(requests))
    result = analyze(path, "--capacity-tokens", 1024, "--capacity-tokens", 5000)
    assert {"format", "requests", "input_tokens", "output_tokens", "duration_s", "reuse"} <= set(result)
    assert result["format"] == "mooncake" and result["requests"] == len(requests)
    assert result["input_tokens"] == sum(r["input_length"] for r in requests)
    assert result["output_tokens"] == sum(r["output_length"] for r in requests)
    stamps = [r["timestamp"] / 1000 for r in requests]
    assert result["duration_s"] == pytest.approx(max(stamps) - min(stamps))
    reuse = result["reuse"]
    assert reuse["known"] is True and reuse["block_tokens"] == 512
    lengths, blocks = [r["input_length"] for r in requests], [r["hash_ids"] for r in requests]
    total = sum(lengths)
    assert reuse["ideal_hit_fraction"] == reference.ideal_hit_tokens(stamps, lengths, blocks, 512) / total
    assert [row["capacity_tokens"] for row in reuse["lru"]] == [1024, 5000]
    for row in reuse["lru"]:
        expected = reference.lru_hit_tokens(stamps, lengths, blocks, 512, row["capacity_tokens"]) / total
        assert row["hit_fraction"] == expected


def test_block_tokens_changes_what_a_block_holds(tmp_path):
    path = write(tmp_path, "t.jsonl", mooncake_lines([
        {"timestamp": 0, "input_length": 64, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 1, "input_length": 64, "output_length": 1, "hash_ids": [1, 2]}]))
    assert analyze(path, "--block-tokens", 32)["reuse"]["ideal_hit_fraction"] == 0.5
    assert analyze(path)["reuse"]["ideal_hit_fraction"] == 0.5        # min(2 × 512, 64) = 64 of 128


@pytest.mark.parametrize("text, name", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,2\n", "azure.csv"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,4,1,5,API log\n", "burst.csv"),
])
def test_a_format_without_reuse_says_so_with_a_reason(tmp_path, text, name):
    result = analyze(write(tmp_path, name, text), "--capacity-tokens", 1000)
    assert result["reuse"]["known"] is False and result["reuse"]["reason"]
    assert result["reuse"]["ideal_hit_fraction"] is None and result["reuse"]["lru"] == []
    assert result["reuse"]["summary"].startswith("reuse unknown")


def test_little_reuse_is_said_plainly(tmp_path):
    requests = [{"timestamp": i, "input_length": 1024, "output_length": 1, "hash_ids": [2 * i, 2 * i + 1]}
                for i in range(20)]
    reuse = analyze(write(tmp_path, "t.jsonl", mooncake_lines(requests)))["reuse"]
    assert reuse["little"] is True and reuse["summary"].startswith("this traffic has little reuse")


def test_a_bad_file_exits_non_zero_naming_line_and_field_and_prints_nothing(tmp_path):
    path = write(tmp_path, "bad.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}\n'
                 '{"timestamp": 1, "input_length": 5, "output_length": "many", "hash_ids": []}\n')
    with pytest.raises(CommandError, match=r"bad.jsonl \(Mooncake/FAST'25 JSONL\), line 2, field output_length"):
        analyze(path)
    run = subprocess.run([sys.executable, "manage.py", "trace", "analyze", str(path), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode != 0 and run.stdout == ""
    assert "line 2, field output_length: 'many' is not a whole number" in run.stderr


def test_inferred_sessions_do_not_join_on_a_shared_system_block(tmp_path):
    # two conversations share block 0 (a one-block system prompt); each turn extends its previous prompt
    requests = [
        {"timestamp": 0, "input_length": 1500, "output_length": 1, "hash_ids": [0, 1, 2]},
        {"timestamp": 1, "input_length": 1400, "output_length": 1, "hash_ids": [0, 7, 8]},
        {"timestamp": 2, "input_length": 2500, "output_length": 1, "hash_ids": [0, 1, 3, 4, 5]},
        {"timestamp": 3, "input_length": 2000, "output_length": 1, "hash_ids": [0, 7, 9, 10]},
        {"timestamp": 4, "input_length": 3000, "output_length": 1, "hash_ids": [0, 1, 3, 4, 11, 12]},
    ]
    result = analyze(write(tmp_path, "t.jsonl", mooncake_lines(requests)))
    assert result["sessions"] == 2 and result["sessions_basis"] == "inferred"
    strata = result["reuse"]["strata"]
    assert strata["first"]["requests"] == 1 and strata["shared_prefix"]["requests"] == 1
    assert strata["returning"]["requests"] == 3
