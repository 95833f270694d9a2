"""The simulated serving engine: a discrete-event model of vLLM's scheduler with LMCache read-back.

Time here is *model* time (seconds of the simulated MI308X node). The server maps it to wall time
through the time scale; the calibration runs it without waiting at all.

A request waits FCFS for the scheduler; the step that admits it first retrieves its external hit,
synchronously as LMCache does by default (``enable_async_loading: false``): the disk-tier part is
read from its device into host DRAM — every read admitted in that step shares the device's
bandwidth — and then every rank copies its share into HBM at the per-GPU cold-read rate (the
rate the vendor's parallel-read patch raises from 0.98 to 5.23 GB/s). Then chunked prefill of the
uncached rest under the step's token budget, then one token per step while decoding. A step that
retrieves blocks the whole batch, as the real forward pass waits for ``start_load_kv``.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from runners.sim.model import MI308X_NODE, QWEN3_CODER_480B, Hardware, ModelSpec, step_seconds

EPSILON = 1e-9
STALL_LOG_SECONDS = 60.0   # model seconds between two "stalled" events of a retrieval that cannot get its staging
# LMCache 0.5.6's PinMonitor: a lookup pin older than pin_timeout_sec is forced off at its next check, every
# pin_check_interval_sec (config.py defaults)
PIN_TIMEOUT_SECONDS = 300.0
PIN_CHECK_SECONDS = 30.0


@dataclass(eq=False)
class SimRequest:
    rid: str
    prompt_tokens: int
    output_tokens: int
    cached_hbm: int = 0           # prefix tokens already in HBM (vLLM prefix cache)
    cached_dram: int = 0          # further tokens LMCache holds in host DRAM
    cached_disk: int = 0          # further tokens LMCache reads from a disk tier / the fs pool
    disk_device: str = "local_nvme"
    # bytes the retrieval reads from each device (all ranks, whole chunks), when the server knows them; else the
    # engine reads cached_disk tokens from disk_device
    disk_bytes: dict | None = None
    staging_chunks: int = 0       # chunks per rank the retrieval stages from disk (LocalDiskBackend allocates them all)
    pinned_chunks: int = 0        # chunks per rank it finds in DRAM (pinned by the lookup until the step ends)
    store: bool = False           # LMCache stores the newly computed KV (a cache arm)
    arrival: float = 0.0
    computed: int = 0
    generated: int = 0
    admitted: bool = False
    state: str = "new"            # waiting, running, done
    first_token_at: float | None = None
    finished_at: float | None = None
    prefill_marks: list = field(default_factory=list)   # (tokens computed, model time) after each prefill step

    @property
    def external_hit(self) -> int:
        return self.cached_dram + self.cached_disk


Listener = Callable[[SimRequest, str, float, dict], None]


class Engine:
    """vLLM V1-like scheduler over model time. Drive it with ``advance_to`` and ``submit``."""

    def __init__(self, *, model: ModelSpec = QWEN3_CODER_480B, hw: Hardware = MI308X_NODE,
                 max_batched_tokens: int = 8192, cold_read: float | None = None, chunk_tokens: int = 256,
                 device_bandwidth: Callable[[str], float] | None = None, listener: Listener | None = None,
                 staging_capacity: int | None = None, stall_log_seconds: float = STALL_LOG_SECONDS):
        self.model, self.hw = model, hw
        # LMCache's CPU pool per rank, in chunks (None: not modelled). A retrieval stages every chunk it reads from
        # disk there before reading any, besides the DRAM chunks the lookups of its step pinned; when they do not fit
        # it waits for ever (LocalCPUBackend.allocate busy-loops: nothing can be evicted) and so does the step.
        self.staging_capacity = staging_capacity
        self.stall_log_seconds = stall_log_seconds
        self.stall: dict | None = None
        self.max_batched_tokens = max_batched_tokens
        self.chunk_tokens = chunk_tokens
        self.cold_read = cold_read if cold_read is not None else hw.cold_read_patched
        self.device_bandwidth = device_bandwidth or (lambda device: 6.8e9)
        self.listener = listener
        self.now = 0.0
        self.queue: list[SimRequest] = []      # FCFS: waiting for admission or mid-prefill
        self.running: list[SimRequest] = []    # decoding
        self.step_end: float | None = None
        self.step_plan: tuple[list[tuple[SimRequest, int]], list[SimRequest], list[dict]] | None = None

    # --- driving -------------------------------------------------------------------------------
    def submit(self, request: SimRequest) -> None:
        request.arrival = self.now
        request.computed = 0
        request.state = "waiting"
        self.queue.append(request)
        self._maybe_start_step()

    def cancel(self, request: SimRequest) -> None:
        """The client went away: drop the request wherever it is (a step in flight finishes)."""
        for pool in (self.queue, self.running):
            if request in pool:
                pool.remove(request)
        request.state = "done"

    def idle(self) -> bool:
        return not (self.queue or self.running or self.step_end is not None)

    def next_event_time(self) -> float | None:
        return self.step_end

    def advance_to(self, target: float) -> None:
        """Process every event up to model time ``target``."""
        while True:
            when = self.next_event_time()
            if when is None or when > target + EPSILON:
                self.now = max(self.now, target)
                return
            self.now = max(self.now, when)
            self._finish_step()
            self._maybe_start_step()

    def run_until_idle(self, limit: float = 1e7) -> None:
        while not self.idle() and self.now < limit:
            when = self.next_event_time()
            if when is None:
                return
            self.advance_to(when)

    # --- internals -----------------------------------------------------------------------------
    def _emit(self, request: SimRequest, kind: str, info: dict | None = None) -> None:
        if self.listener is not None:
            self.listener(request, kind, self.now, info or {})

    def _maybe_start_step(self) -> None:
        if self.step_end is not None:
            return
        decodes = list(self.running)
        budget = self.max_batched_tokens - len(decodes)
        chunks: list[tuple[SimRequest, int]] = []
        retrievals: list[dict] = []
        reads: dict[str, float] = {}
        extra = 0.0
        for request in self.queue:
            if budget <= 0:
                break
            if not request.admitted:
                request.admitted = True
                cached = min(request.cached_hbm + request.external_hit, request.prompt_tokens - 1)
                request.computed = cached
                if request.external_hit:
                    tokens = min(request.external_hit, max(cached - request.cached_hbm, 0))
                    disk = min(request.cached_disk, tokens)
                    per_token = self.model.kv_bytes_per_token()
                    device_bytes = dict(request.disk_bytes) if request.disk_bytes is not None \
                        else {request.disk_device: disk * per_token}
                    for device, size in device_bytes.items():
                        reads[device] = reads.get(device, 0.0) + size
                    rank_bytes = tokens * per_token / self.hw.gpus
                    # each rank copies its share into HBM: chunks read from disk at the per-GPU cold-read rate,
                    # chunks found in host DRAM at the host-to-GPU rate
                    disk_rank = disk * per_token / self.hw.gpus
                    seconds = (self.hw.chunk_overhead * -(-tokens // self.chunk_tokens) + disk_rank / self.cold_read
                               + (rank_bytes - disk_rank) / self.hw.h2d_bandwidth)
                    extra += seconds
                    retrievals.append({"request": request, "tokens": tokens, "rank_bytes": rank_bytes,
                                       "seconds": seconds, "disk_tokens": disk, "device": request.disk_device,
                                       "device_bytes": device_bytes})
            take = min(request.prompt_tokens - request.computed, budget)
            chunks.append((request, take))
            budget -= take
        if not chunks and not decodes:
            return
        stall, wait = self._staging_stall(retrievals)
        if stall is not None:
            self.stall = stall
            self.step_plan = (chunks, decodes, retrievals)
            self.step_end = self.now
            return
        extra += wait        # reads admitted together share their device: one device's reads take its bytes / its bandwidth
        for device, size in reads.items():
            extra += size / max(self.device_bandwidth(device), 1.0)
        prefill = [(r.computed, n) for r, n in chunks]
        contexts = [r.prompt_tokens + r.generated for r in decodes]
        seconds = step_seconds(self.model, self.hw, prefill, contexts) + extra
        stored = sum(n for r, n in chunks if r.store)
        if stored:
            seconds += stored * self.model.kv_bytes_per_token() / self.hw.gpus / self.hw.h2d_bandwidth
        self.step_plan = (chunks, decodes, retrievals)
        self.step_end = self.now + seconds

    def _staging_stall(self, retrievals: list[dict]) -> tuple[dict | None, float]:
        """Whether the step's retrievals get their staging in LMCache's CPU pool: (a stall that never ends, or None;
        model seconds the step waits). Retrievals run one after another; each stages all its disk chunks while the
        DRAM chunks every lookup of the step pinned stay unevictable (unpinned when the step ends). Its own DRAM
        chunks it holds for the copy, so own DRAM + own disk chunks above the pool never fit: a stall for ever. When
        only the other requests' pins are in the way, LMCache's PinMonitor forces them off once they are older than
        pin_timeout_sec, at its next check: the step waits until then."""
        if self.staging_capacity is None:
            return None, 0.0
        pinned_requests = [r["request"] for r in retrievals if r["request"].pinned_chunks]
        pinned = sum(request.pinned_chunks for request in pinned_requests)
        until = self.now
        for retrieval in retrievals:
            request = retrieval["request"]
            if not request.staging_chunks:
                continue
            if request.pinned_chunks + request.staging_chunks > self.staging_capacity:
                return {"request": request, "staging_chunks": request.staging_chunks, "pinned_chunks": pinned,
                        "capacity_chunks": self.staging_capacity, "since": self.now}, 0.0
            if pinned + request.staging_chunks > self.staging_capacity:
                pinned_at = max(other.arrival for other in pinned_requests if other is not request)
                check = (math.floor((pinned_at + PIN_TIMEOUT_SECONDS) / PIN_CHECK_SECONDS) + 1) * PIN_CHECK_SECONDS
                until = max(until, check)
                self._emit(request, "stalled", {"request": request, "staging_chunks": request.staging_chunks,
                                                "pinned_chunks": pinned, "capacity_chunks": self.staging_capacity,
                                                "since": self.now, "until": until})
                pinned = 0
        return None, until - self.now

    def _finish_step(self) -> None:
        if self.stall is not None:
            # the step never ends: its retrieval busy-waits for staging that nothing will free
            self._emit(self.stall["request"], "stalled", self.stall)
            self.step_end = self.now + self.stall_log_seconds
            return
        chunks, decodes, retrievals = self.step_plan
        self.step_end, self.step_plan = None, None
        for retrieval in retrievals:
            self._emit(retrieval["request"], "retrieved", retrieval)
        for request in decodes:
            if request.state != "running":
                continue
            request.generated += 1
            self._emit(request, "token")
            if request.generated >= request.output_tokens:
                self._finish(request)
        for request, take in chunks:
            if request.state == "done":
                continue
            request.computed += take
            request.prefill_marks.append((request.computed, self.now))
            if request.computed >= request.prompt_tokens:
                self.queue.remove(request)
                request.generated = 1
                request.first_token_at = self.now
                request.state = "running"
                self._emit(request, "first_token")
                if request.generated >= request.output_tokens:
                    self._finish(request)
                else:
                    self.running.append(request)

    def _finish(self, request: SimRequest) -> None:
        if request in self.running:
            self.running.remove(request)
        request.state = "done"
        request.finished_at = self.now
        self._emit(request, "finished")
