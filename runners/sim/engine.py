"""The simulated serving engine: a discrete-event model of vLLM's scheduler with LMCache read-back.

Time here is *model* time (seconds of the simulated MI308X node). The server maps it to wall time
through the time scale; the calibration runs it without waiting at all.

A request walks: read-back of its disk-tier hit into host DRAM (``stage 1``: every read on one
device shares that device's bandwidth, processor sharing) → waits FCFS for the GPU → in the step
that admits it, its DRAM-resident hit is copied to HBM by every rank at the per-GPU cold-read
rate (``stage 2``, blocking the step, as LMCache's synchronous retrieve does) → chunked prefill of
the rest under the step's token budget → one token per step while decoding.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from runners.sim.model import MI308X_NODE, QWEN3_CODER_480B, Hardware, ModelSpec, step_seconds

EPSILON = 1e-9


@dataclass(eq=False)
class SimRequest:
    rid: str
    prompt_tokens: int
    output_tokens: int
    cached_hbm: int = 0           # prefix tokens already in HBM (vLLM prefix cache)
    cached_dram: int = 0          # further tokens LMCache holds in host DRAM
    cached_disk: int = 0          # further tokens LMCache reads from a disk tier / the fs pool
    disk_device: str = "local_nvme"
    store: bool = False           # LMCache stores the newly computed KV (a cache arm)
    arrival: float = 0.0
    stage1_left: float = 0.0      # bytes still to read from the device
    computed: int = 0
    generated: int = 0
    admitted: bool = False
    state: str = "new"            # loading, waiting, running, done
    first_token_at: float | None = None
    finished_at: float | None = None
    events: list = field(default_factory=list)

    @property
    def external_hit(self) -> int:
        return self.cached_dram + self.cached_disk


Listener = Callable[[SimRequest, str, float, dict], None]


class Engine:
    """vLLM V1-like scheduler over model time. Drive it with ``advance_to`` and ``submit``."""

    def __init__(self, *, model: ModelSpec = QWEN3_CODER_480B, hw: Hardware = MI308X_NODE,
                 max_batched_tokens: int = 8192, cold_read: float | None = None,
                 device_bandwidth: Callable[[str], float] | None = None, listener: Listener | None = None):
        self.model, self.hw = model, hw
        self.max_batched_tokens = max_batched_tokens
        self.cold_read = cold_read if cold_read is not None else hw.cold_read_patched
        self.device_bandwidth = device_bandwidth or (lambda device: 6.8e9)
        self.listener = listener
        self.now = 0.0
        self.loading: list[SimRequest] = []
        self.queue: list[SimRequest] = []      # FCFS: waiting for admission or mid-prefill
        self.running: list[SimRequest] = []    # decoding
        self.step_end: float | None = None
        self.step_plan: tuple[list[tuple[SimRequest, int]], list[SimRequest], list[dict]] | None = None
        self.busy_seconds = 0.0

    # --- driving -------------------------------------------------------------------------------
    def submit(self, request: SimRequest) -> None:
        request.arrival = self.now
        request.computed = 0
        if request.cached_disk > 0:
            request.stage1_left = request.cached_disk * self.model.kv_bytes_per_token()
            request.state = "loading"
            self.loading.append(request)
        else:
            request.state = "waiting"
            self.queue.append(request)
        self._maybe_start_step()

    def cancel(self, request: SimRequest) -> None:
        """The client went away: drop the request wherever it is (a step in flight finishes)."""
        for pool in (self.loading, self.queue, self.running):
            if request in pool:
                pool.remove(request)
        request.state = "done"

    def idle(self) -> bool:
        return not (self.loading or self.queue or self.running or self.step_end is not None)

    def next_event_time(self) -> float | None:
        times = [] if self.step_end is None else [self.step_end]
        rates = self._load_rates()
        for request in self.loading:
            times.append(self.now + request.stage1_left / rates[id(request)])
        return min(times) if times else None

    def advance_to(self, target: float) -> None:
        """Process every event up to model time ``target``."""
        while True:
            when = self.next_event_time()
            if when is None or when > target + EPSILON:
                self._progress_loads(max(target - self.now, 0.0))
                self.now = max(self.now, target)
                return
            self._progress_loads(max(when - self.now, 0.0))
            self.now = max(self.now, when)
            if self.step_end is not None and self.step_end <= self.now + EPSILON:
                self._finish_step()
            for request in [r for r in self.loading if r.stage1_left <= 1.0]:
                self.loading.remove(request)
                request.state = "waiting"
                self.queue.append(request)
            self._maybe_start_step()

    def run_until_idle(self, limit: float = 1e7) -> None:
        while not self.idle() and self.now < limit:
            when = self.next_event_time()
            if when is None:
                return
            self.advance_to(when)

    # --- internals -----------------------------------------------------------------------------
    def _load_rates(self) -> dict[int, float]:
        per_device: dict[str, int] = {}
        for request in self.loading:
            per_device[request.disk_device] = per_device.get(request.disk_device, 0) + 1
        return {id(r): max(self.device_bandwidth(r.disk_device), 1.0) / per_device[r.disk_device]
                for r in self.loading}

    def _progress_loads(self, seconds: float) -> None:
        if seconds <= 0 or not self.loading:
            return
        rates = self._load_rates()
        for request in self.loading:
            request.stage1_left = max(request.stage1_left - rates[id(request)] * seconds, 0.0)

    def _emit(self, request: SimRequest, kind: str, info: dict | None = None) -> None:
        if self.listener is not None:
            self.listener(request, kind, self.now, info or {})

    def _maybe_start_step(self) -> None:
        if self.step_end is not None:
            return
        decodes = [r for r in self.running]
        budget = self.max_batched_tokens - len(decodes)
        chunks: list[tuple[SimRequest, int]] = []
        retrievals: list[dict] = []
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
                    rank_bytes = tokens * self.model.kv_bytes_per_token() / self.hw.gpus
                    seconds = self.hw.retrieve_latency + rank_bytes / self.cold_read
                    extra += seconds
                    retrievals.append({"request": request, "tokens": tokens, "rank_bytes": rank_bytes,
                                       "seconds": seconds})
            take = min(request.prompt_tokens - request.computed, budget)
            chunks.append((request, take))
            budget -= take
        if not chunks and not decodes:
            return
        prefill = [(r.computed, n) for r, n in chunks]
        contexts = [r.prompt_tokens + r.generated for r in decodes]
        seconds = step_seconds(self.model, self.hw, prefill, contexts) + extra
        stored = sum(n for r, n in chunks if r.store)
        if stored:
            seconds += stored * self.model.kv_bytes_per_token() / self.hw.gpus / self.hw.h2d_bandwidth
        self.step_plan = (chunks, decodes, retrievals)
        self.step_end = self.now + seconds
        self.busy_seconds += seconds

    def _finish_step(self) -> None:
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
