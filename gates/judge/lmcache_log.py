"""LMCache "Retrieved …" log lines → `fxpilot.retrieve/1` records (docs/contracts.md §2).

LMCache 0.5.x writes (colour codes and all, whatever the output is)
  [2026-12-01 08:01:26,240] LMCache INFO: [req_id=cmpl-…] Retrieved 2048 out of 2048 required tokens
  (from 2304 total tokens). size: 0.2344 gb, cost 45.1200 ms, throughput: 5.1900 GB/s; (cache_engine.py:…)
and vLLM (0.20.1 and later) puts its process prefix before every line a worker prints:
`(Worker_TP3 pid=4242) ` — `Worker_DP1_TP3`, `Worker_PP1_TP3`, … when data or pipeline parallelism is
used, plain `(Worker pid=…)` without any. The GPU a retrieval ran on is the worker's place in that grid
(DP, PP, PCP, TP, each size taken from the largest rank the log shows). Older spellings are still read:
`[rank N]`, `(gpu N)`, `rank=N`. A line without any marker is GPU 0.

Two LMCache formats carry the tokens but no size, cost or throughput (checked against the releases' own
cache_engine.py): LMCache 0.3.1–0.3.3, whose count is a tensor's repr (0.3.1 at DEBUG, 0.3.3 at INFO),
  [2025-07-01 10:00:00,000] LMCache INFO: Retrieved tensor(2048) out of 2048 out of total 2304 tokens (cache_engine.py:…)
and LMCache 0.5.x with `use_layerwise: true` (retrieve_layer),
  [2026-12-01 08:01:26,240] LMCache INFO: [req_id=cmpl-…] Retrieved 2048 out of 2048 out of total 2304 tokens (…)
Their records say `bandwidth_logged: false` and carry no bytes, seconds or gbps: G2's read_bw is then invalid
("this LMCache version logs no bandwidth"), never silently absent.

Which tier served a retrieval: LMCache (0.3.1–0.5.6) names none in these lines; one retrieval may even sum chunks
of several tiers. A retrieval is attributed only by the caller's `tier` — the storage of the arm, given when the
arm's LMCache configuration leaves no other tier to answer (docs/judge.md, "read_bw: which tier served").
"""
from __future__ import annotations

import json
import re

RETRIEVED = re.compile(
    r"Retrieved (?P<tokens>\d+) out of (?P<required>\d+) required tokens"
    r"(?: \(from (?P<total>\d+) total tokens\))?\.?\s*size:\s*(?P<size>[\d.]+)\s*gb,\s*"
    r"cost\s*(?P<cost>[\d.]+)\s*ms,\s*throughput:\s*(?P<gbps>[\d.]+)\s*GB/s",
    re.IGNORECASE,
)
# 0.3.1–0.3.3 (`tensor(N)`) and layerwise 0.5.x (plain N): tokens only
RETRIEVED_TOKENS = re.compile(
    r"Retrieved (?:tensor\((?P<tensor>\d+)[^)]*\)|(?P<tokens>\d+)) out of (?P<required>\d+) out of total "
    r"(?P<total>\d+) tokens",
    re.IGNORECASE,
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# vLLM's worker process name, e.g. Worker_TP3, Worker_DP1_PP0_TP7 (DCP and EP parts share the TP GPUs)
WORKER = re.compile(r"^\s*\((?P<name>Worker(?:_[A-Z]+\d+)*) pid=\d+\)")
WORKER_PART = re.compile(r"_(DP|PP|PCP|TP|DCP|EP)(\d+)")
GRID = ("DP", "PP", "PCP", "TP")  # outer to inner: the order vLLM lays ranks on a node's GPUs
GPU_MARKER = re.compile(r"\[rank (\d+)\]|\(gpu (\d+)\)|\brank=(\d+)")
GIB = 1024 ** 3  # LMCache prints sizes in GiB with a lower-case "gb"


def looks_like_log(text: str) -> bool:
    head = text[:1 << 20]
    return RETRIEVED.search(head) is not None or RETRIEVED_TOKENS.search(head) is not None


def worker_ranks(line: str) -> dict[str, int] | None:
    """The parallel ranks named by a vLLM worker prefix ({} for a plain `(Worker pid=…)`), or None."""
    match = WORKER.match(ANSI.sub("", line))
    if match is None:
        return None
    return {part: int(rank) for part, rank in WORKER_PART.findall(match["name"])}


def grid_sizes(lines: list[str]) -> dict[str, int]:
    """Each parallel dimension's size, as the largest rank the workers' prefixes show plus one."""
    sizes = dict.fromkeys(GRID, 1)
    for line in lines:
        ranks = worker_ranks(line) if "Worker" in line else None
        for part, rank in (ranks or {}).items():
            if part in sizes:
                sizes[part] = max(sizes[part], rank + 1)
    return sizes


def gpu_of(line: str, sizes: dict[str, int] | None = None) -> int:
    ranks = worker_ranks(line)
    if ranks is not None:
        sizes = sizes or {part: ranks.get(part, 0) + 1 for part in GRID}
        gpu = 0
        for part in GRID:
            gpu = gpu * sizes.get(part, 1) + ranks.get(part, 0)
        return gpu
    marker = GPU_MARKER.search(line)
    return int(next(group for group in marker.groups() if group is not None)) if marker else 0


def parse_line(line: str, *, run_id: str, arm: str, instance: str = "", simulated: bool = False,
               sizes: dict[str, int] | None = None, tier: str | None = None) -> dict | None:
    """One retrieve record, or None when the line is not a retrieval. `sizes`: the grid of the whole log
    (grid_sizes); without it only the ranks this line names are known. `tier`: the storage that served every
    retrieval of this log when the caller knows it (None: not attributed)."""
    record = {"schema": "fxpilot.retrieve/1", "run_id": run_id, "arm": arm, "instance": instance, "gpu": 0,
              "tokens": 0, "bytes": None, "seconds": None, "gbps": None, "bandwidth_logged": False, "tier": tier,
              "simulated": simulated}
    match = RETRIEVED.search(line)
    if match is not None:
        size_gb = float(match["size"])
        record.update(tokens=int(match["tokens"]), bytes=int(round(size_gb * GIB)),
                      seconds=float(match["cost"]) / 1000.0, gbps=float(match["gbps"]), bandwidth_logged=True)
    else:
        match = RETRIEVED_TOKENS.search(line)
        if match is None:
            return None
        record["tokens"] = int(match["tensor"] if match["tensor"] is not None else match["tokens"])
    record["gpu"] = gpu_of(line, sizes)
    return record


def parse_log(text: str, *, run_id: str, arm: str, instance: str = "", simulated: bool = False,
              tier: str | None = None) -> list[dict]:
    """Every retrieval in a log, in log order. Retrievals of zero tokens (pure misses) are skipped."""
    lines = text.splitlines()
    sizes = grid_sizes(lines)
    records = []
    for line in lines:
        record = parse_line(line, run_id=run_id, arm=arm, instance=instance, simulated=simulated, sizes=sizes,
                            tier=tier)
        if record is not None and record["tokens"] > 0:
            records.append(record)
    return records


def to_jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(record, sort_keys=True) + "\n" for record in records).encode()
