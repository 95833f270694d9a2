"""On the simulated server (HBM and a disk tier, an exact LRU): a replay's second repetition starts as cold as its
first — the tier serves it only the reuse the trace itself holds, not the first repetition's writes."""
from __future__ import annotations

from tests.client.conftest import read_jsonl, run_client
from tests.sim.conftest import MODEL, SimNode, SimServer


def test_the_second_repetition_hits_only_what_the_trace_reuses(tmp_path):
    # three sessions sharing a one-block system prompt (block s), each extending its prompt on its second turn
    rows = ["session_id,turn,prompt_tokens,output_tokens,arrival_offset_s,block_ids"]
    for turn in (1, 2):
        for n, session in enumerate("abc"):
            blocks = ["s", f"{session}1"] + ([f"{session}2"] if turn == 2 else [])
            rows.append(f"{session},{turn},{512 * len(blocks)},4,{(3 * (turn - 1) + n) * 0.1:.1f},{' '.join(blocks)}")
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(rows) + "\n")
    node = SimNode(tmp_path / "node1", scale=0.0005)
    server = SimServer(node, "fx").start()
    out = tmp_path / "replay.jsonl"
    try:
        result = run_client("replay", "--url", server.url, "--arm", "fx", "--out", str(out), "--model", MODEL,
                            "--trace", str(trace), "--block-tokens", "512", "--repetitions", "2", "--evict", "reset",
                            "--quiet")
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out)
    assert len(records) == 12 and all(r["status"] == "ok" for r in records)
    hits = {rep: {(r["session"], r["turn"]): r["cached_tokens"] for r in records if r["repetition"] == rep}
            for rep in (1, 2)}
    # the trace's own reuse: the shared block for b and c's first turns, the previous turn for every second turn
    assert hits[1][("a", 1)] == 0 and hits[1][("b", 1)] == 512 and hits[1][("a", 2)] == 1024
    assert hits[2] == hits[1]   # repetition 2 found nothing of repetition 1 in HBM or in the tier
