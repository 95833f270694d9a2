"""Small traces written in the public formats by the tests themselves (no public data is shipped)."""
from __future__ import annotations

import json
import random
from pathlib import Path


def mooncake_lines(requests: list[dict]) -> str:
    """Mooncake/FAST'25 JSONL, one object per line in the published key order."""
    return "".join(json.dumps({"timestamp": r["timestamp"], "input_length": r["input_length"],
                               "output_length": r["output_length"], "hash_ids": r["hash_ids"]}) + "\n"
                   for r in requests)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def random_requests(seed: int, block_tokens: int) -> list[dict]:
    """A random trace with the features the counting must get right: sessions extending their previous
    prompt, a shared first block, divergent reuse, repeated blocks inside one request, equal timestamps,
    arrivals out of file order, partial last blocks and empty block lists."""
    rng = random.Random(seed)
    pool = list(range(rng.randint(1, 40)))
    out: list[dict] = []
    for _ in range(rng.randint(1, 70)):
        n = rng.randint(0, 9)
        base = list(rng.choice(out)["hash_ids"])[:rng.randint(0, 9)] if out and rng.random() < 0.6 else []
        ids = base + [rng.choice(pool) for _ in range(max(0, n - len(base)))]
        if ids and rng.random() < 0.3:
            ids[0] = 0                   # the shared system-prompt block
        length = max(0, len(ids) * block_tokens - rng.randint(0, block_tokens - 1))
        out.append({"timestamp": rng.choice([0, 0, 1, 2, 3, 5, 8, 13]) * 1000 + rng.choice([0, 0, 250]),
                    "input_length": length, "output_length": rng.randint(0, 50), "hash_ids": ids})
    return out


def run_trace_jobs() -> list[str]:
    """What the worker does after an upload (runners.tasks.analyse_trace), for every trace still queued: the tests'
    database transaction never commits, so the task queued on commit is never sent."""
    from gates.models import CustomerTrace
    from runners import traces

    return [traces.analyse_row(pk) for pk in
            CustomerTrace.objects.filter(state=CustomerTrace.State.QUEUED).order_by("id").values_list("pk", flat=True)]
