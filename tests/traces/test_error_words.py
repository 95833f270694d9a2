"""Issue 23 item 3(c), the trace side: a trace error carries its message template and values from where it is
made, so the portal says it in the reader's language without reading English back."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.utils import translation
from django.utils.translation import gettext

from gates.traces.formats import TraceFormatError, read_bytes
from runners import traces
from runners.remote.workload import TraceError, load_trace

ROOT = Path(__file__).resolve().parents[2]
MADE = {"gates/traces/formats.py": "TraceFormatError", "runners/remote/workload.py": "TraceError"}


def test_every_trace_error_is_made_from_a_marked_template():
    for relative, name in MADE.items():
        tree = ast.parse((ROOT / relative).read_text(encoding="utf-8"))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == name]
        assert calls, relative
        for call in calls:
            template = call.args[2] if name == "TraceFormatError" else call.args[1]
            marked = (isinstance(template, ast.Call) and getattr(template.func, "id", "") == "gettext_noop"
                      and isinstance(template.args[0], ast.Constant)) or isinstance(template, ast.Name)
            assert marked, f"{relative}:{call.lineno}: the message is not a marked template"


BAD_PUBLIC = [
    (b"", "the file is empty"),
    (b'{"timestamp": 0, "input_length": 1.5, "output_length": 1, "hash_ids": []}\n', "is not a whole number"),
    (b'{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": "x"}\n', "is not a list of block ids"),
    (b'{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1e400]}\n', ""),
    (b'{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": []}\n', "finite number"),
    (b'{"timestamp": 0, "input_length": 1, "output_length": 1, "session_id": "a"}\n'
     b'{"timestamp": 1, "input_length": 1, "output_length": 1}\n', "every request names its session"),
    (b"TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", "is not a time like"),
    (b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s,block_ids\na,1,10,1,0,1 2 3 4\n", "block ids for"),
    (b"hello\n", "not a trace format"),
]


@pytest.mark.parametrize("data,words", BAD_PUBLIC)
def test_a_public_format_error_reads_in_chinese_from_its_template(data, words):
    with pytest.raises(TraceFormatError) as caught:
        read_bytes(data, "t.jsonl", block_tokens=4 if b"block_ids" in data else None)
    error = caught.value
    assert words in str(error)
    assert str(error).endswith(error.template % error.values if error.values else error.template)
    with translation.override("zh-hans"):
        assert gettext(error.template) != error.template, error.template     # in the catalogue, translated
        said = traces.translate_format_error(error)
    assert said.startswith("t.jsonl") and all(v in said for v in error.values.values())


@pytest.mark.parametrize("text,column", [
    ("session_id,turn\n", None), ("session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\n", None),
    ("session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,0,1,1,0\n", "turn"),
    ("session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,x,1,0\n", "prompt_tokens"),
    ("session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,1,1,inf\n", "arrival_offset_s"),
    ("session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,1,1,0\na,1,1,1,0\n", "turn"),
    ("session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\n,1,1,1,0\n", "session_id"),
])
def test_a_client_trace_error_reads_in_chinese_from_its_template(tmp_path, text, column):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as caught:
        load_trace(str(path))
    error = caught.value
    assert error.column == column
    with translation.override("zh-hans"):
        assert gettext(error.template) != error.template, error.template
        said = traces.translate_trace_error(error, "ours.csv")
    assert said.startswith("ours.csv") and str(path) not in said
    if column:
        assert f"{column} 列" in said
