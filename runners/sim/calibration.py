"""Run the cold-recovery workload against the engine in model time, without a server or any waiting.

Used to choose the workload sizes in the default plan and by the tests of the cost model; the
real fidelity check (``manage.py simcheck``) drives the HTTP server with the workload client.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from runners.sim.engine import Engine, SimRequest
from runners.sim.model import GB, MI308X_NODE, QWEN3_CODER_480B, Hardware, ModelSpec
from runners.simnode.storage import fx_read_gbps, local_read_gbps

# Table 1 of the seed page: (arm, concurrency) -> (TTFT p50 s, throughput tok/s)
TABLE1 = {
    ("fx", 8): (7.53, 56.6), ("fx", 16): (11.85, 74.9), ("fx", 32): (26.35, 71.6),
    ("local_nvme", 8): (10.17, 43.9), ("local_nvme", 16): (17.31, 53.6), ("local_nvme", 32): (35.73, 53.9),
    ("recompute", 16): (149.48, 4.1),
}


@dataclass(frozen=True)
class ColdRecovery:
    context_tokens: int = 49152     # the session held in the cache (192 chunks of 256)
    new_turn_tokens: int = 256      # the turn appended when the session comes back
    output_tokens: int = 64
    requests_per_client: int = 1
    chunk_size: int = 256


def device_bandwidth(faults: dict | None = None) -> Callable[[str], float]:
    """Read bandwidth (B/s) of ``fx`` or ``local_nvme`` under the node's faults (runners/simnode/storage.py)."""
    faults = faults or {}

    def bandwidth(device: str) -> float:
        return (fx_read_gbps(faults) if device == "fx" else local_read_gbps(faults)) * GB
    return bandwidth


def run_cell(arm: str, concurrency: int, workload: ColdRecovery = ColdRecovery(), *,
             model: ModelSpec = QWEN3_CODER_480B, hw: Hardware = MI308X_NODE, patched: bool = True,
             faults: dict | None = None) -> dict:
    """One cell of Table 1 in model time: TTFT p50 (s) and throughput (output tokens / s)."""
    records: list[dict] = []
    pending: list[int] = []

    def listener(request: SimRequest, kind: str, now: float, info: dict) -> None:
        if kind == "finished":
            records.append({"t_send": request.arrival, "t_first": request.first_token_at, "t_end": now,
                            "output_tokens": request.generated})
            pending.append(int(request.rid.split("-")[0]))

    engine = Engine(model=model, hw=hw, listener=listener, device_bandwidth=device_bandwidth(faults),
                    cold_read=hw.cold_read_patched if patched else hw.cold_read_unpatched)
    sent = dict.fromkeys(range(concurrency), 0)

    def send(client: int) -> None:
        cached = workload.context_tokens // workload.chunk_size * workload.chunk_size
        request = SimRequest(rid=f"{client}-{sent[client]}",
                             prompt_tokens=workload.context_tokens + workload.new_turn_tokens,
                             output_tokens=workload.output_tokens, store=arm != "recompute",
                             cached_disk=0 if arm == "recompute" else cached, disk_device=arm)
        sent[client] += 1
        engine.submit(request)

    for client in range(concurrency):
        send(client)
    while not engine.idle():
        engine.advance_to(engine.next_event_time())
        while pending:
            client = pending.pop(0)
            if sent[client] < workload.requests_per_client:
                send(client)
    ttfts = [r["t_first"] - r["t_send"] for r in records]
    span = max(r["t_end"] for r in records) - min(r["t_send"] for r in records)
    return {"ttft_p50": statistics.median(ttfts), "throughput": sum(r["output_tokens"] for r in records) / span,
            "requests": len(records)}


def table(workload: ColdRecovery = ColdRecovery(), **kwargs) -> dict:
    return {cell: run_cell(cell[0], cell[1], workload, **kwargs) for cell in TABLE1}
