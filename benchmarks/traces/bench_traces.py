"""Issue 24: `trace analyze` on a million-request trace in ≤ 15 s and ≤ 1 GB on one core.

Writes two synthetic traces of 1,000,000 requests (made here, seeded; no public data): a Mooncake/FAST'25
JSONL with conversation-like reuse (sessions whose turns extend their previous prompt, a one-block system
prompt shared by all, think gaps; about 24 blocks of 512 tokens per request) and an Azure LLM inference CSV.
Each is analysed by `manage.py trace analyze --json` with four --capacity-tokens, in a child process pinned to
one CPU; its CPU seconds (user + system) and peak resident memory are measured, and wall time reported.

Baseline in the same run: the plain-Python reference of the same definitions (`gates.traces.reference`:
one pass per capacity, as the definitions read) against the product on the first 100,000 requests of the
Mooncake trace, both in children pinned to the same CPU — the ratio is the speed-up; the two must give the
same numbers.

    .venv/bin/python benchmarks/traces/bench_traces.py [--requests 1000000] [--baseline-requests 100000]

Exits 1 when a bar is missed or the numbers differ; writes benchmarks/out/traces-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAPACITIES = (1_000_000, 10_000_000, 100_000_000, 1_000_000_000)   # tokens
BUDGET_S, BUDGET_MB = 15.0, 1024.0


def write_mooncake(path: Path, requests: int, seed: int = 24) -> None:
    """Conversation-like: 40 % of requests open a session (system block 0 + 4–40 new blocks), the rest return
    to one of the 20,000 most recent sessions, extending its last prompt by 1–4 blocks."""
    rng = random.Random(seed)
    next_id, t = 1, 0
    sessions: list[list[int]] = []
    with open(path, "w") as f:
        for _ in range(requests):
            t += rng.randint(0, 6)
            if sessions and rng.random() < 0.6:
                j = rng.randrange(len(sessions))
                grow = rng.randint(1, 4)
                ids = sessions[j][:-1] + list(range(next_id, next_id + grow + 1))
                next_id += grow + 1
                sessions[j] = ids
            else:
                k = rng.randint(4, 40)
                ids = [0, *range(next_id, next_id + k)]
                next_id += k
                sessions.append(ids)
                if len(sessions) > 20_000:
                    sessions.pop(0)
            if len(ids) > 120:                   # a conversation that grew too long ends; a new one takes it
                ids = ids[:1] + ids[-20:]
            length = len(ids) * 512 - rng.randint(0, 511)
            f.write(f'{{"timestamp": {t}, "input_length": {length}, "output_length": {rng.randint(1, 800)}, '
                    f'"hash_ids": [{", ".join(map(str, ids))}]}}\n')


def write_azure(path: Path, requests: int, seed: int = 24) -> None:
    """TIMESTAMP with 7 fractional digits (100 ns ticks), as the 2023 trace writes it."""
    rng = random.Random(seed)
    ticks = 18 * 3600 * 10_000_000
    with open(path, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for _ in range(requests):
            ticks += rng.randint(0, 2_000_000)
            seconds, fraction = divmod(ticks, 10_000_000)
            day, seconds = divmod(seconds, 86_400)
            f.write(f"2023-11-{16 + day:02d} {seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}."
                    f"{fraction:07d},{rng.randint(1, 8000)},{rng.randint(1, 800)}\n")


PRODUCT = """
import json, os, sys, time
os.sched_setaffinity(0, {cpu})
sys.path.insert(0, {root!r})
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fxpilot.settings")
import django; django.setup()
from io import StringIO
from django.core.management import call_command
args = ["trace", "analyze", {path!r}, "--json"] + sum([["--capacity-tokens", str(c)] for c in {caps!r}], [])
start = time.process_time(); wall = time.perf_counter()
out = StringIO(); call_command(*args, stdout=out)
print(json.dumps({{"cpu_s": time.process_time() - start, "wall_s": time.perf_counter() - wall,
                  "result": json.loads(out.getvalue())}}))
"""

REFERENCE = """
import json, os, sys, time
os.sched_setaffinity(0, {cpu})
sys.path.insert(0, {root!r})
from gates.traces import reference
ts, lengths, blocks = [], [], []
with open({path!r}) as f:
    for line in f:
        o = json.loads(line); ts.append(o["timestamp"] / 1000); lengths.append(o["input_length"]); blocks.append(o["hash_ids"])
start = time.process_time(); wall = time.perf_counter()
total = sum(lengths)
ideal = reference.ideal_hit_tokens(ts, lengths, blocks, 512) / total
lru = [reference.lru_hit_tokens(ts, lengths, blocks, 512, c) / total for c in {caps!r}]
print(json.dumps({{"cpu_s": time.process_time() - start, "wall_s": time.perf_counter() - wall,
                  "ideal": ideal, "lru": lru}}))
"""


def child(code: str) -> dict:
    """Run code in a fresh interpreter; its own CPU seconds and peak RSS (MB) from its rusage."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode:
        raise SystemExit(f"child failed: {run.stderr[-2000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    result["process_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result["max_rss_mb"] = after.ru_maxrss / 1024          # the largest child so far: run the largest last
    result["process_wall_s"] = time.perf_counter() - started
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--baseline-requests", type=int, default=100_000)
    parser.add_argument("--cpu", type=int, default=0, help="the CPU the children are pinned to")
    parser.add_argument("--keep", help="a folder to keep the generated traces in")
    args = parser.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="fxpilot-bench-traces-"))
    folder.mkdir(parents=True, exist_ok=True)
    mooncake, azure, small = folder / "mooncake.jsonl", folder / "azure.csv", folder / "mooncake-small.jsonl"
    if not mooncake.exists():
        write_mooncake(mooncake, args.requests)
    if not azure.exists():
        write_azure(azure, args.requests)
    with open(mooncake) as src, open(small, "w") as dst:
        for i, line in enumerate(src):
            if i >= args.baseline_requests:
                break
            dst.write(line)
    fill = dict(cpu={args.cpu}, root=str(ROOT), caps=CAPACITIES)
    load = os.getloadavg()
    reference_run = child(REFERENCE.format(path=str(small), **fill))
    product_small = child(PRODUCT.format(path=str(small), **fill))
    azure_run = child(PRODUCT.format(path=str(azure), **fill))
    product_run = child(PRODUCT.format(path=str(mooncake), **fill))   # the largest last (peak RSS)
    same = (abs(product_small["result"]["reuse"]["ideal_hit_fraction"] - reference_run["ideal"]) < 1e-12 and
            all(abs(row["hit_fraction"] - want) < 1e-12
                for row, want in zip(product_small["result"]["reuse"]["lru"], reference_run["lru"], strict=True)))
    blocks = sum(1 for _ in open(mooncake))  # noqa: SIM115 - a count
    summary = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "load_average": load, "cpu": args.cpu,
        "trace_bytes": mooncake.stat().st_size, "requests": blocks,
        "ideal_hit_fraction": product_run["result"]["reuse"]["ideal_hit_fraction"],
        "product_1m": {k: product_run[k] for k in ("cpu_s", "wall_s", "process_cpu_s", "max_rss_mb")},
        "azure_1m": {k: azure_run[k] for k in ("cpu_s", "wall_s", "process_cpu_s")},
        "baseline": {"requests": args.baseline_requests, "reference_cpu_s": reference_run["cpu_s"],
                     "product_cpu_s": product_small["cpu_s"],
                     "ratio": reference_run["cpu_s"] / max(product_small["cpu_s"], 1e-9), "same_numbers": same},
    }
    out = ROOT / "benchmarks" / "out"
    out.mkdir(exist_ok=True)
    (out / f"traces-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    ok = same and product_run["process_cpu_s"] <= BUDGET_S and product_run["max_rss_mb"] <= BUDGET_MB
    print("budget met" if ok else "BUDGET MISSED or numbers differ")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
