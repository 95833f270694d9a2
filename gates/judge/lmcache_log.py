"""LMCache "Retrieved …" log lines → `fxpilot.retrieve/1` records (docs/contracts.md §2).

A line looks like
  LMCache INFO: Retrieved 2048 out of 2048 required tokens (from 2048 total tokens). size: 0.2344 gb,
  cost 45.1200 ms, throughput: 5.1900 GB/s
with the GPU worker marked `[rank N]`, `(gpu N)` or `rank=N` (vLLM's worker prefix); no marker means GPU 0.
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
GPU_MARKER = re.compile(r"\[rank (\d+)\]|\(gpu (\d+)\)|\brank=(\d+)")
GIB = 1024 ** 3  # LMCache prints sizes in GiB with a lower-case "gb"


def looks_like_log(text: str) -> bool:
    return RETRIEVED.search(text[:1 << 20]) is not None


def parse_line(line: str, *, run_id: str, arm: str, instance: str = "", simulated: bool = False) -> dict | None:
    """One retrieve record, or None when the line is not a retrieval."""
    match = RETRIEVED.search(line)
    if match is None:
        return None
    marker = GPU_MARKER.search(line)
    gpu = int(next(group for group in marker.groups() if group is not None)) if marker else 0
    size_gb = float(match["size"])
    return {
        "schema": "fxpilot.retrieve/1", "run_id": run_id, "arm": arm, "instance": instance, "gpu": gpu,
        "tokens": int(match["tokens"]), "bytes": int(round(size_gb * GIB)), "seconds": float(match["cost"]) / 1000.0,
        "gbps": float(match["gbps"]), "simulated": simulated,
    }


def parse_log(text: str, *, run_id: str, arm: str, instance: str = "", simulated: bool = False) -> list[dict]:
    """Every retrieval in a log, in log order. Retrievals of zero tokens (pure misses) are skipped."""
    records = []
    for line in text.splitlines():
        record = parse_line(line, run_id=run_id, arm=arm, instance=instance, simulated=simulated)
        if record is not None and record["tokens"] > 0:
            records.append(record)
    return records


def to_jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(record, sort_keys=True) + "\n" for record in records).encode()
