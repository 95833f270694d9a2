"""The simulated vLLM + LMCache server: OpenAI-compatible HTTP over the engine in model time.

Every response says it is simulated (``"simulated": true`` in JSON, ``X-Fxpilot-Simulated: 1``);
/metrics carries ``fxpilot_simulated 1`` and ``fxpilot_sim_time_scale``. Tokens leave when the
engine's model clock, mapped to the wall clock by the time scale, reaches them.

The model clock runs only while the simulator waits (its event loop in select()): the wall time it
spends working — reading and parsing prompts, hashing, writing streams — or waiting for a CPU it
shares with other work stands still on the model clock, and an engine event found overdue (a wake-up
that came late) is processed at its own model time, the clock set back to it. So the simulator's own
CPU time and scheduling delays are not modelled as time the GPUs spent. The final event of every stream
reports the request's modelled delays (``simulated_timing``), which the workload client takes as the
record's timing on the simulated node's clock after checking them against what it measured.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import re
import sys
import time
import uuid
import zlib
from dataclasses import dataclass, field

import numpy as np
from aiohttp import web

from runners.sim import diskstats
from runners.sim.config import ServeConfig
from runners.sim.engine import STALL_LOG_SECONDS, Engine, SimRequest
from runners.sim.model import (
    COLD_START,
    GB,
    GIB,
    QWEN3_CODER_480B,
    Hardware,
    ModelSpec,
    StartupSpec,
    hbm_kv_capacity_tokens,
)
from runners.sim.nonehash import none_hash, vllm_function
from runners.sim.tiers import DiskTier, DramTier, FsPool, LruTier, Writer, chunk_keys
from runners.simnode.storage import fx_read_gbps, fx_write_gbps, local_read_gbps, local_write_gbps

ROCM_SUFFIX = "+rocm721"
VLLM_BLOCK = 16                   # vLLM's KV block (tokens), as its cache_config_info reports num_gpu_blocks
HBM_BLOCK = 256                   # HBM residency is tracked per 256 tokens (vLLM's blocks are 16; hits round down)
PROMPT_IDS = re.compile(rb'"prompt"\s*:\s*\[(?=\s*\d)')
# parse_body keeps a token-id prompt's JSON text under this key when it is already compact JSON (digits and commas,
# no number starting with 0: a prompt with token id 0 takes the slow way), so the first
# event's echo of it (return_token_ids) costs a copy rather than encoding tens of thousands of numbers again
PROMPT_JSON = "\x00prompt_json"
_ECHO = "\x00echo\x00"
TOKEN_BASE, TOKEN_SPAN = 1000, 30000
WORDS = ("the", "cache", "token", "array", "flash", "read", "write", "model", "layer", "block", "return",
         "value", "index", "chunk", "prefix", "tier", "disk", "link", "queue", "batch", "step", "time")
SIMULATED_HEADER = {"X-Fxpilot-Simulated": "1"}
# Wall seconds an idle engine waits for the rest of a wave of requests (see SimServer.admit).
GATHER_SECONDS = 0.03

log = logging.getLogger("fxpilot.sim")


# LMCache's own formatter colours every line (lmcache/logging.py), whether or not it writes to a terminal.
_LMCACHE_COLOURS = {"INFO": "\x1b[32;20m", "WARNING": "\x1b[33;20m", "ERROR": "\x1b[31;20m"}
_RESET, _UNDERLINE = "\x1b[0m", "\x1b[4m"


def worker_prefix(rank: int | None, tensor_parallel: int) -> str:
    """vLLM's prefix on a process's output lines: `(Worker_TP3 pid=…) ` for a TP rank's worker (plain
    `(Worker pid=…)` without tensor parallelism), `(EngineCore pid=…) ` for the scheduler's process."""
    pid = os.getpid()
    if rank is None:
        return f"(EngineCore pid={pid + 1}) "
    name = f"Worker_TP{rank}" if tensor_parallel > 1 else "Worker"
    return f"({name} pid={pid + 2 + rank}) "


def lmcache_log(message: str, *, level: str = "INFO", where: str = "cache_engine.py:986:lmcache.v1.cache_engine",
                prefix: str = "") -> None:
    """A line as LMCache 0.5.x writes it on stdout (the deploy keeps stdout as the server log), after vLLM's
    process prefix when it comes from a worker."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    colour = _LMCACHE_COLOURS.get(level, "")
    print(f"{prefix}{colour}[{stamp},{int(time.time() * 1000) % 1000:03d}] LMCache {level}:{_RESET} {message} "
          f"{_UNDERLINE}({where}){_RESET}", flush=True)


def vllm_log(level: str, message: str, *, where: str = "simulated", prefix: str = "") -> None:
    print(f"{prefix}{level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {message}", flush=True)


def parse_body(raw: bytes, fast: bool) -> dict:
    """JSON body; a long token-id prompt is parsed by numpy (the stdlib takes ~10 ms for 50k ids, which
    at a small time scale would show up as seconds of model time)."""
    match = PROMPT_IDS.search(raw) if fast else None
    if match:
        end = raw.find(b"]", match.end())
        ids = raw[match.end():end]
        if end > 0 and b"[" not in ids:
            tokens = np.fromstring(ids, dtype=np.int64, sep=",")
            if tokens.size == ids.count(b",") + 1:
                body = json.loads(raw[:match.end()] + raw[end:])
                body["prompt"] = tokens
                if not ids.translate(None, b"0123456789,") and b",0" not in ids and not ids.startswith(b"0"):
                    body[PROMPT_JSON] = b"[" + ids + b"]"  # already what json.dumps(prompt) would write
                return body
    return json.loads(raw)


def tokenize(text: str) -> list[int]:
    """Deterministic stand-in for a tokenizer: one id per word or punctuation mark."""
    return [TOKEN_BASE + zlib.crc32(piece.encode()) % TOKEN_SPAN for piece in re.findall(r"\w+|[^\w\s]", text)]


def detokenize(token: int) -> str:
    return " " + WORDS[token % len(WORDS)]


def output_tokens(prompt: bytes, count: int, temperature: float, seed: int | None) -> list[int]:
    """Greedy (temperature 0) output depends on the prompt alone, so a cache hit changes no answer."""
    digest = hashlib.sha256(prompt).hexdigest()
    if temperature > 0:
        digest += f":{seed if seed is not None else random.getrandbits(64)}"
    rng = random.Random(digest)
    return [TOKEN_BASE + rng.randrange(TOKEN_SPAN) for _ in range(count)]


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param


@dataclass
class Counters:
    values: dict = field(default_factory=dict)

    def add(self, name: str, amount: float) -> None:
        self.values[name] = self.values.get(name, 0.0) + amount


class SimServer:
    def __init__(self, config: ServeConfig):
        self.config = config
        self.model = ModelSpec(kv_cache_bytes=config.kv_cache_bytes)
        self.hw = Hardware(gpus=config.tensor_parallel, gpu_memory_utilization=config.gpu_memory_utilization)
        capacity = hbm_kv_capacity_tokens(self.model, self.hw)
        self.hbm_tokens = capacity  # what vLLM reports as num_gpu_blocks × block_size (vllm:cache_config_info)
        if capacity <= 0:
            raise SystemExit(f"ValueError: not enough GPU memory for the KV cache: the model's weights "
                             f"({self.model.total_params * self.model.weight_bytes / GB:.0f} GB) do not fit in "
                             f"{self.hw.gpus} x 192 GB at gpu_memory_utilization={self.hw.gpu_memory_utilization} "
                             f"(simulated); raise --tensor-parallel-size")
        self.hbm = LruTier("hbm", capacity // HBM_BLOCK if config.prefix_caching else 0)
        self.counters = Counters()
        self.requests_seen = 0
        self.clock0 = time.monotonic()
        self.slip = 0.0                   # wall seconds of late wake-ups taken off the model clock
        self.busy = 0.0                   # wall seconds the event loop worked (outside select): off the model clock
        self.awake_since: float | None = self.clock0   # when the loop last woke (None while it waits)
        self.scale = config.time_scale
        self.gathering: list[SimRequest] | None = None
        lm = config.lmcache
        self.tiers: list = []
        self.writer = Writer()
        self.rank_chunk_bytes = 0
        self.pool_chunks: int | None = None     # LMCache's CPU pool per rank, in chunks (DRAM tier and staging)
        self.write_free: dict[str, float] = {}  # model time each device's queue of disk writes is done
        self.diskstats = _diskstats_path(config)
        self.none_hash: int | None = None       # NONE_HASH when PYTHONHASHSEED fixes it (the same in every process)
        self.none_hash_missing = False          # the xxhash functions without the xxhash package
        if lm is not None and os.environ.get("PYTHONHASHSEED") is not None:
            try:
                self.none_hash = none_hash(lm.hash_algorithm, os.environ["PYTHONHASHSEED"])
            except ImportError:
                self.none_hash, self.none_hash_missing = 0, True   # LMCache then logs "Using default NONE_HASH=0"
        if lm is not None:
            # LMCache's sizes are GiB (2^30 bytes) per rank: 0.5.6 allocates max_local_cpu_size * 1024**3 and caps
            # its disk backend at max_local_disk_size * 1024**3 (tests/real/test_lmcache_config.py holds this).
            self.rank_chunk_bytes = int(lm.chunk_size * self.model.kv_bytes_per_token() / self.hw.gpus)
            # LocalCPUBackend exists whenever max_local_cpu_size > 0: with local_cpu true it is the DRAM tier (an LRU
            # of whole chunks), with local_cpu false only the allocator that stages every transfer
            self.pool_chunks = int(max(lm.max_local_cpu_size, 0) * GIB // self.rank_chunk_bytes)
            if lm.local_cpu and lm.max_local_cpu_size > 0:
                self.tiers.append(DramTier("dram", self.pool_chunks, self.hw.gpus))
            if lm.local_disk is not None:
                self.tiers.append(DiskTier("local_disk", lm.local_disk,
                                           int(lm.max_local_disk_size * GIB // self.rank_chunk_bytes),
                                           lm.chunk_size, self.rank_chunk_bytes, self.writer))
            if lm.fs_pool is not None:
                self.tiers.append(FsPool("fs", lm.fs_pool, lm.chunk_size, self.rank_chunk_bytes, self.writer))
        cold_read = self.hw.cold_read_patched if lm is None or lm.parallel_read else self.hw.cold_read_unpatched
        self.engine = Engine(model=self.model, hw=self.hw, max_batched_tokens=config.max_batched_tokens,
                             cold_read=cold_read, device_bandwidth=self._bandwidth, listener=self._on_event,
                             chunk_tokens=lm.chunk_size if lm else 256,
                             staging_capacity=self.pool_chunks if lm is not None and self.tiers else None,
                             # LMCache repeats its warning every 0.1 s; here about every 10 wall seconds
                             stall_log_seconds=max(STALL_LOG_SECONDS, 10.0 / config.time_scale))
        self.streams: dict[int, asyncio.Queue] = {}
        self.wake = asyncio.Event()
        self.fx_warned = False
        self.degraded = False

    # --- clock and engine ----------------------------------------------------------------------------
    def model_now(self) -> float:
        """Model seconds so far: the wall time spent waiting, less late wake-ups, over the scale. While the loop
        works the clock stands at the instant it woke."""
        now = self.awake_since if self.awake_since is not None else time.monotonic()
        return (now - self.clock0 - self.busy - self.slip) / self.scale

    def waiting(self) -> None:
        """The event loop goes into select(): what it worked since it woke comes off the model clock."""
        if self.awake_since is not None:
            self.busy += time.monotonic() - self.awake_since
            self.awake_since = None

    def woke(self) -> None:
        self.awake_since = time.monotonic()

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the model clock from `loop`'s waits (its selector's select())."""
        selector = loop._selector  # noqa: SLF001 - the one place the loop waits
        select = selector.select

        def timed_select(timeout=None):
            self.waiting()
            try:
                return select(timeout)
            finally:
                self.woke()

        selector.select = timed_select

    def sync(self) -> float:
        """Bring the engine to the model clock's now and return it. An event found overdue means the simulator
        ran behind (it was not scheduled, or was busy with other requests): the clock slips back to that
        event, so the lost wall time never becomes model time — neither in that request's delays nor in
        the arrival times of the requests that come in meanwhile."""
        now = self.model_now()
        upcoming = self.engine.next_event_time()
        if upcoming is not None and now > upcoming:
            self.slip += (now - upcoming) * self.scale
            now = upcoming
        self.engine.advance_to(now)
        return now

    def _bandwidth(self, device: str) -> float:
        faults = self.config.node.faults()
        return (fx_read_gbps(faults) if device == "fx" else local_read_gbps(faults)) * GB

    def _on_event(self, request: SimRequest, kind: str, now: float, info: dict) -> None:
        if kind == "stalled":
            self._log_stall(request, info)
            return
        queue = self.streams.get(id(request))
        if kind == "retrieved":
            self._log_retrieval(request, info)
            self._count_device(getattr(request, "device_kinds", None) or {}, reading=True)
        if queue is not None:
            queue.put_nowait(kind)

    def _device_name(self, kind: str) -> str | None:
        """The block device the node's `findmnt`, `lsblk` and `nvme list` name for a tier's storage kind."""
        state = self.config.node.state or {}
        if kind == "fx":
            return diskstats.device_name((state.get("fx") or {}).get("namespace") or "/dev/nvme1n1")
        if kind == "local_nvme":
            return diskstats.device_name((state.get("local_nvme") or {}).get("namespace") or "/dev/nvme0n1")
        return "sda2"

    def _count_device(self, device_bytes: dict, reading: bool) -> None:
        """Add a retrieval's reads (or a store's writes) to the node's diskstats file, per device."""
        if self.diskstats is None:
            return
        for kind, size in device_bytes.items():
            name = self._device_name(kind)
            if not size or name is None:
                continue
            chunk = max(self.rank_chunk_bytes, 1)
            ios = max(int(size // chunk), 1)  # one file per rank and chunk
            try:
                if reading:
                    diskstats.add(self.diskstats, name, read_bytes=int(size), read_ios=ios)
                else:
                    diskstats.add(self.diskstats, name, write_bytes=int(size), write_ios=ios)
            except OSError as error:
                vllm_log("WARNING", f"cannot update the simulated node's diskstats {self.diskstats}: {error}")
                self.diskstats = None

    async def admit(self, request: SimRequest) -> None:
        """Hand a request to the engine. Requests that reach an idle engine within GATHER_SECONDS (wall) of
        each other start from the same model instant: a client's real send spread of a few milliseconds
        would otherwise be magnified by the time scale into seconds of model time and split one wave of
        requests into two steps, which a real server at full speed does not do."""
        if self.gathering is not None:
            self.gathering.append(request)
            return
        if not self.engine.idle():
            self.sync()
            self.engine.submit(request)
            self.wake.set()
            return
        opened = self.sync()
        self.gathering = [request]
        await asyncio.sleep(GATHER_SECONDS)
        batch, self.gathering = self.gathering, None
        self.engine.advance_to(opened)
        for item in batch:
            self.engine.submit(item)
        self.wake.set()

    async def drive(self) -> None:
        """Advance the engine with the wall clock; sleep until its next event or a new request."""
        try:
            await self._drive()
        except Exception:
            log.exception("the simulated engine failed")
            vllm_log("ERROR", "the simulated engine failed; exiting (traceback above)")
            os._exit(1)

    async def _drive(self) -> None:
        while True:
            self.sync()
            upcoming = self.engine.next_event_time()
            self.wake.clear()
            if upcoming is None:
                await self.wake.wait()
                continue
            delay = (upcoming - self.model_now()) * self.scale
            if delay > 0:
                try:
                    await asyncio.wait_for(self.wake.wait(), delay)
                except TimeoutError:
                    pass

    def timing(self, request: SimRequest, arrived: float) -> dict:
        """The request's modelled delays, in wall seconds at the time scale, from its own arrival: what its
        first token and its end would have taken on the wall had the simulator never run behind. Never
        more than a client measures (the server sends nothing before its model time), less by the slip."""
        start = max(arrived, request.arrival)
        first = request.first_token_at if request.first_token_at is not None else start
        end = request.finished_at if request.finished_at is not None else first
        return {"clock": "simulated", "time_scale": self.scale, "ttft_s": round(max(first - start, 0.0) * self.scale, 6),
                "e2e_s": round(max(end - start, 0.0) * self.scale, 6)}

    # --- the prefix index ----------------------------------------------------------------------------
    def _kv_seed(self) -> str:
        """Where every chunk key's chain starts. With PYTHONHASHSEED set, LMCache's chain starts from vLLM's NONE_HASH
        of the configured hash function, so instances (and restarts) with another function or seed write other chunk
        names and find nothing of each other's; without the seed the real processes each draw their own (the
        scheduler's lookups then match no worker's keys), which the simulator does not model: its keys stay shared."""
        base = f"{self.config.model}|tp{self.hw.gpus}|kv{self.model.kv_cache_bytes:g}"
        if self.none_hash is None:
            return base
        return f"{base}|{vllm_function(self.config.lmcache.hash_algorithm) or 'builtin'}|{self.none_hash}"

    def _tier_usable(self, tier) -> bool:
        if isinstance(tier, (DiskTier, FsPool)) and self.config.node.storage_kind(tier.path) == "fx":
            if not self.config.node.fx_up():
                if not self.fx_warned:
                    lmcache_log(f"storage backend {tier.name} at {tier.path} is unreachable "
                                f"(FX path down); falling back to recompute", level="WARNING",
                                prefix=worker_prefix(0, self.hw.gpus))
                    self.fx_warned = True
                return False
            self.fx_warned = False
        return True

    def lookup(self, rid: str, prompt: np.ndarray, data: bytes) -> SimRequest:
        lm = None if self.degraded else self.config.lmcache
        every = [] if not (self.config.prefix_caching or lm) else chunk_keys(data, HBM_BLOCK, self._kv_seed())
        blocks = every if self.config.prefix_caching else []
        keys = []
        if lm is not None:
            step = lm.chunk_size // HBM_BLOCK
            same_chain = lm.chunk_size % HBM_BLOCK == 0
            keys = every[step - 1::step] if same_chain else chunk_keys(data, lm.chunk_size, self._kv_seed())
        hbm_blocks = 0
        for key in blocks:
            if key not in self.hbm:
                break
            self.hbm.touch(key)
            hbm_blocks += 1
        hbm_hit = hbm_blocks * HBM_BLOCK
        if self.config.prefix_caching:
            self.counters.add("vllm:prefix_cache_queries_total", len(prompt))
            self.counters.add("vllm:prefix_cache_hits_total", hbm_hit)
        request = SimRequest(rid=rid, prompt_tokens=len(prompt), output_tokens=1, cached_hbm=hbm_hit)
        request.keys = (blocks, keys)
        if lm is None:
            return request
        usable = [tier for tier in self.tiers if self._tier_usable(tier)]
        now = self.engine.now
        # LMCache's StorageManager.batched_contains: one pass over its backends in order (LocalCPUBackend,
        # LocalDiskBackend, RemoteBackend); each serves the run of chunks it holds from where the previous one
        # stopped. A disk write still in flight is not found (its key enters the index when the write is done).
        found: list = []
        for tier in usable:
            while len(found) < len(keys) and tier.visible(keys[len(found)], now):
                tier.touch(keys[len(found)])
                found.append(tier)
        hit = len(found) * lm.chunk_size
        load = max(min(hit, len(prompt) - 1) - hbm_hit, 0)
        request.store = True
        # tokens past the HBM hit, split by the tier each chunk comes from; the retrieval reads whole chunks
        dram = disk = disk_chunks = 0
        device = "local_nvme"
        device_bytes: dict[str, float] = {}
        chunk_bytes = lm.chunk_size * self.model.kv_bytes_per_token()
        kinds: dict[str, str] = {}
        for index, tier in enumerate(found):
            start = max(index * lm.chunk_size, hbm_hit)
            end = min((index + 1) * lm.chunk_size, hbm_hit + load)
            if end <= start:
                continue
            if tier.name == "dram":
                dram += end - start
            else:
                if tier.name not in kinds:
                    kind = self.config.node.storage_kind(tier.path)
                    kinds[tier.name] = kind if kind in ("fx", "local_nvme") else "other"
                kind = kinds[tier.name]
                if not disk:
                    device = kind if kind != "other" else "local_nvme"
                disk += end - start
                disk_chunks += 1
                device_bytes[kind] = device_bytes.get(kind, 0.0) + chunk_bytes
        request.cached_dram, request.cached_disk, request.disk_device = dram, disk, device
        request.disk_bytes = {}
        for kind, size in device_bytes.items():   # a tier on neither device is read at the local disk's rate
            bandwidth_kind = "local_nvme" if kind == "other" else kind
            request.disk_bytes[bandwidth_kind] = request.disk_bytes.get(bandwidth_kind, 0.0) + size
        request.device_kinds = device_bytes
        request.staging_chunks = disk_chunks
        # the lookup pins every chunk it finds in DRAM, those under vLLM's own HBM hit too
        request.pinned_chunks = sum(1 for tier in found if tier.name == "dram")
        self.counters.add("vllm:external_prefix_cache_queries_total", len(prompt) - hbm_hit)
        self.counters.add("vllm:external_prefix_cache_hits_total", load)
        self.counters.add("lmcache:num_requested_tokens_total", len(prompt))
        self.counters.add("lmcache:num_lookup_tokens_total", len(prompt))
        self.counters.add("lmcache:num_hit_tokens_total", hit)
        self.counters.add("lmcache:num_lookup_hits_total", hit)
        self.counters.add("lmcache:num_vllm_hit_tokens_total", hbm_hit)
        names = [tier.name for tier in found]
        for name in set(names):
            self.counters.add(f'fxpilot_sim_tier_hit_tokens_total{{tier="{name}"}}', names.count(name) * lm.chunk_size)
        if disk and request.disk_device == "fx" and any(t.name == "fs" for t in self.tiers):
            self.counters.add("lmcache:num_remote_read_bytes_total", disk * self.model.kv_bytes_per_token())
        lmcache_log(f"Reqid: {rid}, Total tokens {len(prompt)}, LMCache hit tokens: {hit}, need to load: {load}",
                    where="vllm_v1_adapter.py:1434:lmcache.integration.vllm.vllm_v1_adapter",
                    prefix=worker_prefix(None, self.hw.gpus))
        return request

    def store(self, rid: str, request: SimRequest) -> None:
        """After prefill: the prompt's blocks stay in HBM; LMCache writes its chunks to every enabled tier."""
        blocks, keys = request.keys
        self.hbm.put_many(blocks)
        lm = None if self.degraded else self.config.lmcache
        if lm is None:
            return
        stored = 0
        for tier in self.tiers:
            if not self._tier_usable(tier):
                continue
            try:
                if isinstance(tier, (DiskTier, FsPool)):
                    stored = max(stored, self._store_to_disk(tier, keys, request, lm.chunk_size))
                else:
                    stored = max(stored, tier.put_many(keys))
            except OSError as error:
                lmcache_log(f"failed to store to {tier.name}: {error}", level="WARNING",
                            prefix=worker_prefix(0, self.hw.gpus))
        if stored:
            self.counters.add("lmcache:num_stored_tokens_total", stored * lm.chunk_size)
            lmcache_log(f"Storing KV cache for {stored * lm.chunk_size} out of {request.prompt_tokens} tokens "
                        f"(skip_leading_tokens=0) for request {rid}",
                        where="vllm_v1_adapter.py:1180:lmcache.integration.vllm.vllm_v1_adapter",
                        prefix=worker_prefix(0, self.hw.gpus))

    def _store_to_disk(self, tier, keys: list[str], request: SimRequest, chunk_size: int) -> int:
        """Write-through to a disk tier, as LMCache's StorageManager.batched_put hands every stored chunk to every
        backend: each new chunk's write is queued on its device when the prefill step that completed it ended (vLLM's
        connector stores after every step) and takes the chunk's bytes at the device's write bandwidth; the chunk is
        found by lookups only once its write is done (LocalDiskBackend indexes a key after writing its file; the fs
        connector renames its temporary file into place)."""
        new = [key for key in keys if not (key in tier.entries if isinstance(tier, DiskTier) else key in tier)]
        ready: dict[str, float] = {}
        if new:
            kind = self.config.node.storage_kind(tier.path)
            faults = self.config.node.faults()
            rate = (fx_write_gbps(faults) if kind == "fx" else local_write_gbps(faults)) * GB
            chunk_bytes = chunk_size * self.model.kv_bytes_per_token()
            marks = request.prefill_marks or [(request.prompt_tokens, request.first_token_at or self.engine.now)]
            index = {key: position for position, key in enumerate(keys)}
            free = self.write_free.get(kind, 0.0)
            mark = 0
            for key in sorted(new, key=index.__getitem__):
                end = (index[key] + 1) * chunk_size
                while mark < len(marks) - 1 and marks[mark][0] < end:
                    mark += 1
                free = max(free, marks[mark][1]) + chunk_bytes / rate
                ready[key] = free
            self.write_free[kind] = free
            self._count_device({kind: chunk_bytes * len(new)}, reading=False)
        return tier.put_many(keys, ready)

    def _log_stall(self, request: SimRequest, info: dict) -> None:
        """LMCache 0.5.6's LocalCPUBackend.allocate with nothing to evict (every rank's worker says it)."""
        for rank in range(self.hw.gpus):
            lmcache_log("No eviction candidates found in local cpu backend. Local cpu memory is under pressure. "
                        "Waiting for 0.1 seconds before retrying.", level="WARNING",
                        where="local_cpu_backend.py:724:lmcache.v1.storage_backend.local_cpu_backend",
                        prefix=worker_prefix(rank, self.hw.gpus))
        if info.get("since") == self.engine.now:
            size = self.rank_chunk_bytes / GIB
            what = (f"until {info['until'] - info['since']:.0f} model seconds later, when LMCache's pin monitor forces "
                    f"the other requests' lookup pins off (pin_timeout_sec 300 s, checked every 30 s); every request "
                    f"of this server waits with it" if "until" in info else
                    "for memory that nothing will free: every request of this server waits with it, for ever")
            vllm_log("WARNING", f"(simulated) request {request.rid} stalls: its retrieval stages "
                     f"{info['staging_chunks']} chunks per rank ({info['staging_chunks'] * size:.2f} GiB) from disk "
                     f"beside {info['pinned_chunks']} pinned DRAM chunks, in a CPU pool of {info['capacity_chunks']} "
                     f"chunks per rank (max_local_cpu_size {self.config.lmcache.max_local_cpu_size:g} GiB); LMCache "
                     f"busy-waits {what}")

    def _log_retrieval(self, request: SimRequest, info: dict) -> None:
        size_gib = info["rank_bytes"] / GIB
        seconds = info["seconds"]
        layerwise = bool(self.config.lmcache is not None and self.config.lmcache.use_layerwise)
        for rank in range(self.hw.gpus):
            if layerwise:  # LMCache 0.5.x retrieve_layer: tokens only, no size, cost or throughput
                lmcache_log(f"[req_id={request.rid}] Retrieved {info['tokens']} out of {info['tokens']} out of total "
                            f"{request.prompt_tokens} tokens (simulated)",
                            where="cache_engine.py:1146:lmcache.v1.cache_engine", prefix=worker_prefix(rank, self.hw.gpus))
                continue
            lmcache_log(f"[req_id={request.rid}] Retrieved {info['tokens']} out of {info['tokens']} required tokens "
                        f"(from {request.prompt_tokens} total tokens). size: {size_gib:.4f} gb, cost "
                        f"{seconds * 1000:.4f} ms, throughput: {size_gib / seconds:.4f} GB/s; (simulated)",
                        prefix=worker_prefix(rank, self.hw.gpus))

    def backend_names(self) -> list[str]:
        """LMCache 0.5.6's storage backends of a worker, in its order (storage_backend/__init__.py)."""
        lm = self.config.lmcache
        if lm is None:
            return []
        names = ["LocalCPUBackend"] if lm.max_local_cpu_size > 0 else []
        if lm.local_disk is not None and lm.max_local_disk_size > 0:
            names.append("LocalDiskBackend")
        if lm.fs_pool is not None:
            names.append("RemoteBackend" if lm.raw.get("remote_url") else "RemoteBackend-fs")
        return names

    def clear_cache(self, rank: int, locations: list[str] | None) -> int:
        """`DELETE /cache/clear` on worker ``rank``'s internal API server: StorageManager.clear(locations). Only
        LocalCPUBackend has a clear (it empties the DRAM tier of that rank; nothing when local_cpu is false); the
        other backends are skipped with LMCache's warning. Returns the tokens removed, as LMCache does."""
        removed = 0
        for name in self.backend_names():
            if locations is not None and name not in locations:
                continue
            if name == "LocalCPUBackend":
                dram = next((tier for tier in self.tiers if isinstance(tier, DramTier)), None)
                if dram is not None:
                    removed += dram.clear_rank(rank) * self.config.lmcache.chunk_size
            else:
                lmcache_log(f"Storage backend {name} does not support clear operation. Skipping.", level="WARNING",
                            where="storage_manager.py:1144:lmcache.v1.storage_backend.storage_manager",
                            prefix=worker_prefix(rank, self.hw.gpus))
        return removed

    def api_endpoints(self) -> list[tuple[int | None, str, int, str | None]]:
        """(worker rank or None for the scheduler, host, port, Unix socket path or None) of every internal API server
        LMCache 0.5.6 starts with this configuration: the scheduler's on internal_api_server_port_start, worker i's on
        the port after it plus i (api_server.py), filtered by internal_api_server_include_index_list."""
        lm = self.config.lmcache
        if lm is None or not lm.api_enabled:
            return []
        out = []
        for offset in range(self.hw.gpus + 1):
            if lm.api_include and offset not in lm.api_include:
                continue
            port = lm.api_port_start + offset
            socket_path = f"{lm.api_socket_prefix}_{port}" if lm.api_socket_prefix else None
            out.append((None if offset == 0 else offset - 1, lm.api_host, port, socket_path))
        return out

    def startup_lines(self) -> None:
        """What LMCache 0.5.6 logs at start in each of its processes (the scheduler's, then every worker's): the chunk
        hash it loaded, vLLM's first-block hash (NONE_HASH) and, in the workers, whether the disk tiers use O_DIRECT."""
        lm = self.config.lmcache
        if lm is None:
            return
        seed = os.environ.get("PYTHONHASHSEED")
        function = vllm_function(lm.hash_algorithm)
        for rank in [None, *range(self.hw.gpus)]:
            prefix = worker_prefix(rank, self.hw.gpus)
            where = "token_database.py:{}:lmcache.v1.token_database"
            if function is None:
                lmcache_log(f"Could not load '{lm.hash_algorithm}' from vLLM. Using builtin hash. This may cause "
                            f"inconsistencies in distributed caching.", level="WARNING", where=where.format(162),
                            prefix=prefix)
                if seed is None:
                    lmcache_log("Using builtin hash without PYTHONHASHSEED set. For production environments "
                                "(non-testing scenarios), you MUST set PYTHONHASHSEED to ensure consistent hashing "
                                "across processes. Example: export PYTHONHASHSEED=0", level="WARNING",
                                where=where.format(170), prefix=prefix)
            else:
                lmcache_log(f"Loaded '{function}' from vllm.utils.hashing", where=where.format(191), prefix=prefix)
                if seed is None and function.endswith("_cbor"):
                    vllm_log("WARNING", "PYTHONHASHSEED is not set. This will lead to non-reproducible block-hashes "
                             "when using CBOR-based hash functions such as sha256_cbor or xxhash_cbor. Consider "
                             "setting PYTHONHASHSEED to a fixed value for reproducibility.",
                             where="kv_cache_utils.py:100", prefix=prefix)
            try:
                if self.none_hash_missing:
                    raise ImportError("xxhash")
                value = self.none_hash if self.none_hash is not None else none_hash(lm.hash_algorithm, seed)
            except ImportError:
                lmcache_log("Using default NONE_HASH=0 (vLLM not available)", where=where.format(108), prefix=prefix)
            else:
                lmcache_log(f"Initialized NONE_HASH={value} from vLLM (>= PR#20511)", where=where.format(100),
                            prefix=prefix)
            lmcache_log(f"Using hash algorithm: {lm.hash_algorithm}", where=where.format(110), prefix=prefix)
            if rank is None:
                continue
            if lm.local_disk is not None and lm.max_local_disk_size > 0:
                lmcache_log(f"Using O_DIRECT for disk I/O: {lm.use_odirect}",
                            where="local_disk_backend.py:171:lmcache.v1.storage_backend.local_disk_backend",
                            prefix=prefix)
            if lm.fs_pool is not None:
                lmcache_log(f"Initialized FSConnector with base paths [PosixPath({str(lm.fs_pool)!r})], relative tmp "
                            f"dir: None, read ahead size: None, use O_DIRECT: {lm.fs_use_odirect}",
                            where="fs_connector.py:121:lmcache.v1.storage_backend.connector.fs_connector",
                            prefix=prefix)

    def reset_prefix_cache(self, external: bool) -> None:
        self.hbm.clear()
        if external:
            for tier in self.tiers:
                if tier.name == "dram":
                    tier.clear()

    # --- faults ----------------------------------------------------------------------------------------
    def degrade_due(self) -> None:
        """Fault lmcache_degraded_after_requests=N: LMCache's health monitor finds the system unhealthy after N
        requests, says so as LMCache 0.5.x does, and every later request recomputes; vLLM keeps serving."""
        limit = self.config.node.faults().get("lmcache_degraded_after_requests")
        if self.degraded or self.config.lmcache is None or limit is None or self.requests_seen <= int(limit):
            return
        self.degraded = True
        lmcache_log("HealthMonitor: System unhealthy, entering degraded mode", level="WARNING",
                    where="base.py:288:lmcache.v1.health_monitor.base", prefix=worker_prefix(0, self.hw.gpus))

    def crash_due(self) -> bool:
        limit = self.config.node.faults().get("server_crash_after_requests")
        return limit is not None and self.requests_seen > int(limit)

    # --- metrics ----------------------------------------------------------------------------------------
    def _cache_dtype(self) -> str:
        return "auto" if self.model.kv_cache_bytes == 2.0 else "fp8"

    def metrics_text(self) -> str:
        name = self.config.served_names[0]
        label = f'model_name="{name}",engine="0"'
        lines = ["# fxpilot simulated server: every figure below comes from a model, not from hardware",
                 "# HELP fxpilot_simulated 1 when this server is the fxpilot simulator.",
                 "# TYPE fxpilot_simulated gauge", "fxpilot_simulated 1",
                 "# HELP fxpilot_sim_time_scale Wall seconds per model second.",
                 "# TYPE fxpilot_sim_time_scale gauge", f"fxpilot_sim_time_scale {self.scale:g}",
                 "# HELP fxpilot_sim_clock_slip_seconds_total Wall seconds the model clock stood still while "
                 "the simulator ran behind.",
                 "# TYPE fxpilot_sim_clock_slip_seconds_total counter",
                 f"fxpilot_sim_clock_slip_seconds_total {self.slip:.6f}",
                 "# HELP fxpilot_sim_staging_stalled 1 while a retrieval waits for LMCache staging memory that "
                 "nothing will free.",
                 "# TYPE fxpilot_sim_staging_stalled gauge",
                 f"fxpilot_sim_staging_stalled {1 if self.engine.stall else 0}"]
        counters = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
                    "vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total",
                    "vllm:external_prefix_cache_hits_total", "vllm:prompt_tokens_cached_total",
                    "vllm:num_preemptions_total"]
        if self.config.lmcache is not None:
            counters += ["lmcache:num_requested_tokens_total", "lmcache:num_hit_tokens_total",
                         "lmcache:num_stored_tokens_total", "lmcache:num_lookup_tokens_total",
                         "lmcache:num_lookup_hits_total", "lmcache:num_vllm_hit_tokens_total",
                         "lmcache:num_remote_read_bytes_total"]
        for metric in counters:
            lines += [f"# TYPE {metric[:-6]} counter", f"{metric}{{{label}}} {self.counters.values.get(metric, 0.0)}"]
        lines += ["# TYPE vllm:request_success counter",
                  f'vllm:request_success_total{{{label},finished_reason="length"}} '
                  f'{self.counters.values.get("vllm:request_success_total", 0.0)}']
        for key, value in sorted(self.counters.values.items()):
            if key.startswith("fxpilot_sim_tier_hit_tokens_total"):
                lines.append(f"{key} {value}")
        engine = self.engine
        lines += ["# TYPE vllm:num_requests_running gauge",
                  f"vllm:num_requests_running{{{label}}} {len(engine.running) + sum(r.admitted for r in engine.queue)}",
                  "# TYPE vllm:num_requests_waiting gauge",
                  f"vllm:num_requests_waiting{{{label}}} {sum(not r.admitted for r in engine.queue)}",
                  # vLLM's info gauge of its cache configuration (a gauge set to 1; the values are labels): the
                  # KV blocks of HBM it profiled, in blocks of 16 tokens (the workload client's soak sizes its
                  # session pool above them)
                  "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                  "# TYPE vllm:cache_config_info gauge",
                  f'vllm:cache_config_info{{block_size="{VLLM_BLOCK}",cache_dtype="{self._cache_dtype()}",'
                  f'enable_prefix_caching="{self.config.prefix_caching}",engine="0",'
                  f'gpu_memory_utilization="{self.hw.gpu_memory_utilization}",'
                  f'num_gpu_blocks="{self.hbm_tokens // VLLM_BLOCK}"}} 1.0',
                  "# TYPE vllm:kv_cache_usage_perc gauge",
                  f"vllm:kv_cache_usage_perc{{{label}}} "
                  f"{len(self.hbm) / self.hbm.capacity if self.hbm.capacity else 0.0:.6f}"]
        return "\n".join(lines) + "\n"


def _diskstats_path(config: ServeConfig):
    """The node's diskstats file: $FXPILOT_DISKSTATS (the simulated node sets it for every command), else
    <node root>/proc/diskstats when that exists; None when neither (no counters to update)."""
    named = os.environ.get("FXPILOT_DISKSTATS")
    if named:
        return named
    root = config.node.root
    if root is not None and (root / "proc" / "diskstats").exists():
        return str(root / "proc" / "diskstats")
    return None


# --- LMCache's internal API server -----------------------------------------------------------------------------

def _api_json(payload: dict, status: int = 200) -> web.Response:
    """FastAPI's PlainTextResponse(json.dumps(payload, indent=2), media_type="application/json") as LMCache sends it."""
    return web.Response(text=json.dumps(payload, indent=2), status=status, content_type="application/json")


def build_api_app(server: SimServer, rank: int | None) -> web.Application:
    """One process's internal API server (LMCache 0.5.6 internal_api_server): `DELETE /cache/clear[?locations=…]`.
    The scheduler's (rank None) has no LMCache engine and answers 503, as LMCache's _check_lmcache_engine does."""

    async def clear(request: web.Request) -> web.Response:
        if request.method != "DELETE":
            return web.json_response({"detail": "Method Not Allowed"}, status=405)
        if rank is None:
            return _api_json({"error": "LMCache API is unavailable", "message": "LMCache engine not configured."}, 503)
        locations = request.query.getall("locations", None)
        removed = server.clear_cache(rank, locations)
        return _api_json({"status": "success", "num_removed": removed})

    async def not_found(request: web.Request) -> web.Response:
        return web.json_response({"detail": "Not Found"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/cache/clear", clear)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


async def start_api_servers(server: SimServer) -> list[web.AppRunner]:
    """Start every internal API server the LMCache configuration asks for; a port that cannot be bound is logged
    (as uvicorn does in LMCache's thread) and the server runs on without it."""
    runners = []
    for rank, host, port, socket_path in server.api_endpoints():
        prefix = worker_prefix(rank, server.hw.gpus)
        where = "api_server.py:{}:lmcache.v1.internal_api_server.api_server"
        said = f"socket {socket_path}" if socket_path else f"port {port}"
        lmcache_log(f"Init internal API server on {said}", where=where.format(105), prefix=prefix)
        runner = web.AppRunner(build_api_app(server, rank), access_log=None)
        await runner.setup()
        try:
            if socket_path:
                os.makedirs(os.path.dirname(socket_path) or ".", exist_ok=True)
                if os.path.exists(socket_path):
                    os.unlink(socket_path)
                site = web.UnixSite(runner, socket_path)
            else:
                site = web.TCPSite(runner, host, port)
            await site.start()
        except OSError as error:
            await runner.cleanup()
            lmcache_log(f"[Errno {error.errno}] error while attempting to bind on address ({host!r}, {port}): "
                        f"{(error.strerror or str(error)).lower()} (internal API server not started)", level="ERROR",
                        where=where.format(126), prefix=prefix)
            continue
        lmcache_log(f"Starting LMCache internal API server on {said}", where=where.format(119), prefix=prefix)
        runners.append(runner)
    return runners


# --- HTTP ------------------------------------------------------------------------------------------------

def _error(message: str, status: int, kind: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}, "simulated": True}
    return web.json_response(body, status=status, headers=SIMULATED_HEADER)


def _prompt_tokens(body: dict, chat: bool) -> np.ndarray:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", param="messages")
        text = ""
        for message in messages:
            if not isinstance(message, dict) or "role" not in message:
                raise BadRequest("every message needs a role and content", param="messages")
            content = message.get("content") or ""
            if isinstance(content, list):
                content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
            text += f"<|im_start|>{message['role']}\n{content}<|im_end|>\n"
        return np.array(tokenize(text + "<|im_start|>assistant\n"), dtype=np.uint32)
    prompt = body.get("prompt")
    if isinstance(prompt, np.ndarray):
        if prompt.size and int(prompt.min()) >= 0 and int(prompt.max()) < 2 ** 32:
            return prompt.astype(np.uint32)
        raise BadRequest("prompt token ids must be non-negative 32-bit integers", param="prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return np.array(tokenize(prompt), dtype=np.uint32)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and 0 <= t < 2 ** 32 for t in prompt):
        return np.array(prompt, dtype=np.uint32)
    raise BadRequest("prompt must be a string, a list of token ids, or a list holding one of these "
                     "(the simulated server takes one prompt per request)", param="prompt")


def _number(body: dict, key: str, default, kind=float, low=None):
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{key} must be a number", param=key)
    value = kind(value)
    if low is not None and value < low:
        raise BadRequest(f"{key} must be at least {low}", param=key)
    return value


def build_app(server: SimServer) -> web.Application:
    config = server.config

    @web.middleware
    async def simulated_header(request: web.Request, handler):
        try:
            response = await handler(request)
        except web.HTTPException as error:
            if error.status == 404:
                return _error(f"Not Found: {request.path}", 404, "NotFoundError")
            raise
        if not response.prepared:
            response.headers.update(SIMULATED_HEADER)
        return response

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": config.vllm_version + ROCM_SUFFIX, "simulated": True})

    async def models(request: web.Request) -> web.Response:
        data = [{"id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                 "root": config.model, "parent": None, "max_model_len": config.max_model_len,
                 # vLLM 0.20.1's ModelCard carries one default ModelPermission (tests/real/test_contract.py)
                 "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                 "created": int(time.time()), "allow_create_engine": False, "allow_sampling": True,
                                 "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                 "allow_fine_tuning": False, "organization": "*", "group": None,
                                 "is_blocking": False}]}
                for name in config.served_names]
        return web.json_response({"object": "list", "data": data, "simulated": True})

    async def metrics(request: web.Request) -> web.Response:
        if config.node.faults().get("metrics_missing"):  # a server started without its /metrics (issue 28)
            return web.Response(status=404, text="404: Not Found")
        return web.Response(text=server.metrics_text(), content_type="text/plain", charset="utf-8")

    async def reset(request: web.Request) -> web.Response:
        external = request.query.get("reset_external", "false").lower() in ("1", "true")
        # Newer vLLM refuses while requests hold blocks, and says so in a 200 answer; 0.20.1 answers an
        # empty 200 whatever happened. The fault reset_refused makes a reset fail.
        preempt = request.query.get("reset_running_requests", "false").lower() in ("1", "true")
        refused = bool(config.node.faults().get("reset_refused")) or not (preempt or server.engine.idle())
        if not refused:
            server.reset_prefix_cache(external)
        vllm_log("INFO", f"Resetting prefix cache (external={external})" + (": refused, blocks are held" if refused else ""))
        if config.vllm_version == "0.20.1":
            return web.Response(status=200)
        return web.json_response({"success": not refused}, status=200)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=False)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=True)

    async def generate(request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = parse_body(await request.read(), fast=not chat)
        except (ValueError, UnicodeDecodeError):
            return _error("the request body is not valid JSON", 400, "BadRequestError")
        if not isinstance(body, dict):
            return _error("the request body must be a JSON object", 400, "BadRequestError")
        if body.get("model") not in config.served_names:
            return _error(f"The model `{body.get('model')}` does not exist.", 404, "NotFoundError", "model")
        try:
            prompt = _prompt_tokens(body, chat)
            limit = body.get("max_completion_tokens") if chat else None
            max_tokens = _number(body, "max_tokens", None, int, 1)
            max_tokens = _number(body, "max_completion_tokens", max_tokens, int, 1) if limit is not None else max_tokens
            if max_tokens is None:
                max_tokens = max(min(128 if chat else 16, config.max_model_len - len(prompt)), 1)
            temperature = _number(body, "temperature", 1.0, float, 0.0)
            seed = body.get("seed")
            if len(prompt) + max_tokens > config.max_model_len:
                raise BadRequest(f"This model's maximum context length is {config.max_model_len} tokens. However, "
                                 f"you requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
                                 f"{max_tokens} in the completion).")
            if not len(prompt):
                raise BadRequest("the prompt is empty", param="prompt")
        except BadRequest as error:
            return _error(str(error), error.status, error.kind, error.param)
        stream = bool(body.get("stream"))
        usage_in_stream = bool((body.get("stream_options") or {}).get("include_usage"))
        want_ids = bool(body.get("return_token_ids"))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        server.requests_seen += 1
        server.degrade_due()
        crash = server.crash_due()
        data = prompt.tobytes()
        tokens = output_tokens(data, max_tokens, temperature, seed if isinstance(seed, int) else None)
        # the request's own arrival on the model clock (a wave gathered by admit() starts earlier, together)
        arrived = server.sync() if server.gathering is None else server.model_now()
        sim = server.lookup(rid, prompt, data)
        sim.output_tokens = max_tokens
        queue: asyncio.Queue = asyncio.Queue()
        server.streams[id(sim)] = queue
        await server.admit(sim)
        created = int(time.time())
        name = body["model"]
        events = None if chat else CompletionEvents(rid, name, created, want_ids)
        response: web.StreamResponse | None = None
        sent = 0
        try:
            if stream:
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                       **SIMULATED_HEADER})
                await response.prepare(request)
            finished = False
            while not finished:
                # every event the engine has queued by now goes out in one write: on a busy machine the driver
                # falls behind and queues several tokens, and one send per token then costs more CPU than the
                # request's own work (each token keeps its own event, as vLLM sends them)
                kinds = [await queue.get()]
                while not queue.empty():
                    kinds.append(queue.get_nowait())
                chunks = []
                for kind in kinds:
                    if kind == "first_token":
                        server.store(rid, sim)
                    if kind in ("first_token", "token"):
                        sent += 1
                        if stream:
                            if chat and sent == 1:
                                chunks.append(_chunk(rid, name, created, chat, None, None, role=True))
                            final = "length" if sent >= max_tokens else None
                            echo = prompt if (want_ids and sent == 1 and not chat) else None
                            if events is not None and (echo is None or body.get(PROMPT_JSON)):
                                chunks.append(events.token(tokens[sent - 1], final,
                                                           body.get(PROMPT_JSON) if echo is not None else None))
                            else:
                                chunks.append(_chunk(rid, name, created, chat, tokens[sent - 1], final,
                                                     want_ids=want_ids, prompt_ids=echo,
                                                     prompt_json=body.get(PROMPT_JSON)))
                    if kind == "finished":
                        finished = True
                        break
                if chunks:
                    await response.write(b"".join(chunks))
                if crash and sent:
                    vllm_log("ERROR", "simulated crash (fault server_crash_after_requests): exiting")
                    os._exit(70)
        except (ConnectionResetError, asyncio.CancelledError):
            server.engine.cancel(sim)
            server.streams.pop(id(sim), None)
            raise
        server.streams.pop(id(sim), None)
        cached = min(sim.cached_hbm + sim.external_hit, sim.prompt_tokens - 1)
        usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + sent, "completion_tokens": sent}
        # With --enable-prompt-tokens-details vLLM reports the cached tokens; 0.20.1 leaves the details out
        # altogether when nothing was cached (newer versions send 0).
        if config.prompt_tokens_details and (cached or config.vllm_version != "0.20.1"):
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        server.counters.add("vllm:prompt_tokens_total", len(prompt))
        server.counters.add("vllm:prompt_tokens_cached_total", cached)
        server.counters.add("vllm:generation_tokens_total", sent)
        server.counters.add("vllm:request_success_total", 1)
        if stream:
            if usage_in_stream:
                final = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                         "created": created, "model": name, "choices": [], "usage": usage, "simulated": True,
                         "simulated_timing": server.timing(sim, arrived)}
                await response.write(b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        text = "".join(detokenize(t) for t in tokens[:sent])
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": "length", "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        if want_ids:
            choice["token_ids"] = tokens[:sent]
        return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                  "created": created, "model": name, "choices": [choice], "usage": usage,
                                  "simulated": True}, headers=SIMULATED_HEADER)

    app = web.Application(middlewares=[simulated_header], client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_get("/ping", health)
    app.router.add_get("/version", version)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    if config.dev_mode:
        app.router.add_post("/reset_prefix_cache", reset)

    async def start_driver(app: web.Application) -> None:
        app["driver"] = asyncio.ensure_future(server.drive())
        app["api_runners"] = await start_api_servers(server)

    async def stop_driver(app: web.Application) -> None:
        app["driver"].cancel()
        for runner in app.get("api_runners", []):
            await runner.cleanup()
        server.writer.flush()

    app.on_startup.append(start_driver)
    app.on_cleanup.append(stop_driver)
    return app


_WORD_JSON = tuple(json.dumps(" " + word).encode() for word in WORDS)


class CompletionEvents:
    """The token events of one streamed completion exactly as `_chunk` writes them, byte for byte, from parts made
    once per request: a soak sends a hundred of them per request, and encoding a dict for each cost more server
    CPU than the rest of the request (tests/sim checks them against `_chunk`)."""

    def __init__(self, rid: str, name: str, created: int, want_ids: bool):
        self.head = (b'data: {"id":' + json.dumps(rid).encode() + b',"object":"text_completion","created":'
                     + str(int(created)).encode() + b',"model":' + json.dumps(name).encode()
                     + b',"choices":[{"index":0,"text":')
        self.want_ids = want_ids

    def token(self, token: int, finish: str | None, prompt_json: bytes | None = None) -> bytes:
        parts = [self.head, _WORD_JSON[token % len(WORDS)], b',"logprobs":null,"finish_reason":',
                 b"null" if finish is None else json.dumps(finish).encode(), b',"stop_reason":null']
        if self.want_ids:
            parts += [b',"prompt_token_ids":', prompt_json or b"null", b',"token_ids":[', str(int(token)).encode(), b"]"]
        parts.append(b'}],"usage":null,"simulated":true}\n\n')
        return b"".join(parts)


def _chunk(rid: str, name: str, created: int, chat: bool, token: int | None, finish: str | None, *,
           role: bool = False, want_ids: bool = False, prompt_ids: np.ndarray | None = None,
           prompt_json: bytes | None = None) -> bytes:
    if chat:
        delta = {"role": "assistant", "content": ""} if role else {"content": detokenize(token)}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": detokenize(token), "logprobs": None, "finish_reason": finish,
                  "stop_reason": None}
        obj = "text_completion"
    if want_ids and token is not None:
        if not chat:
            # vLLM echoes the whole prompt in the first event of a completion stream, null afterwards
            echo = None if prompt_ids is None else _ECHO if prompt_json else prompt_ids.tolist()
            choice["prompt_token_ids"] = echo
        choice["token_ids"] = [token]
    payload = {"id": rid, "object": obj, "created": created, "model": name, "choices": [choice], "usage": None,
               "simulated": True}
    text = json.dumps(payload, separators=(",", ":")).encode()
    if prompt_json and prompt_ids is not None and want_ids and not chat:
        text = text.replace(json.dumps(_ECHO).encode(), prompt_json, 1)
    return b"data: " + text + b"\n\n"


def describe(server: SimServer) -> str:
    config, lm = server.config, server.config.lmcache
    parts = [f"model={config.model}", f"tp={config.tensor_parallel}", f"time_scale={config.time_scale:g}",
             f"prefix_caching={config.prefix_caching}", f"hbm_kv_tokens={server.hbm.capacity * HBM_BLOCK}"]
    if lm is None:
        parts.append("kv_connector=none (recompute)")
    else:
        for tier in server.tiers:
            where = f" at {tier.path} ({config.node.storage_kind(tier.path)})" if hasattr(tier, "path") else ""
            size = f" capacity={tier.capacity} chunks/rank" if isinstance(tier, LruTier) else ""
            parts.append(f"tier {tier.name}{where}{size}")
        if server.pool_chunks is not None:
            parts.append(f"cpu_pool={server.pool_chunks} chunks/rank (local_cpu={lm.local_cpu})")
        parts.append(f"parallel_read={lm.parallel_read} config={lm.source}")
    return "simulated server: " + ", ".join(parts)


def cold_start(config: ServeConfig, spec: StartupSpec = COLD_START, model: ModelSpec = QWEN3_CODER_480B) -> float:
    """A first start with empty compile caches (runners.sim.model.StartupSpec), at the time scale: nothing listens
    until it is done, as with vLLM. The caches are then filled (a marker per cache), so the next start is warm.
    Returns the model seconds it took."""
    steps = (("Loading weights took %.2f seconds", spec.load_seconds(model)),
             ("torch.compile takes %.2f s in total", spec.compile_seconds),
             ("Graph capturing finished in %.0f secs", spec.graph_capture_seconds))
    vllm_log("INFO", f"cold start (simulated): compile caches empty at {config.compile_cache}")
    for said, seconds in steps:
        time.sleep(seconds * config.time_scale)
        vllm_log("INFO", said % seconds + " (simulated, model time)")
    for variable, sub in (("VLLM_CACHE_ROOT", "torch_compile_cache"), ("TORCHINDUCTOR_CACHE_DIR", ""),
                          ("TRITON_CACHE_DIR", "")):
        root = os.environ.get(variable)
        if root:
            where = os.path.join(root, sub) if sub else root
            os.makedirs(where, exist_ok=True)
            with open(os.path.join(where, "fxpilot-sim-compiled.json"), "w") as handle:
                json.dump({"simulated": True, "model": config.model}, handle)
    total = sum(seconds for _, seconds in steps)
    vllm_log("INFO", f"cold start done in {total:.0f} s of model time (simulated)")
    return total


def run(config: ServeConfig) -> None:
    """Serve until killed (as `vllm serve` does)."""
    faults = config.node.faults()
    if faults.get("slow_start_seconds"):
        # a server still loading (a real one takes minutes): nothing listens until it is done
        vllm_log("INFO", f"loading the model (fault slow_start_seconds={faults['slow_start_seconds']})")
        time.sleep(float(faults["slow_start_seconds"]))
    if config.lmcache is not None and faults.get("lmcache_init_fails"):
        # LMCache that fails to initialise does not stop vLLM: it logs, then every request recomputes.
        lmcache_log("Failed to initialize LMCacheManager components: RuntimeError: No supported cpu connector "
                    "found (simulated fault lmcache_init_fails). System will operate in degraded mode (recompute).",
                    level="ERROR", where="manager.py:107:lmcache.v1.manager",
                    prefix=worker_prefix(0, config.tensor_parallel))
        config.lmcache = None
    lm = config.lmcache
    if lm is not None and lm.max_local_cpu_size <= 0 and (lm.local_disk is not None or lm.fs_pool is not None):
        # 0.5.6 creates no LocalCPUBackend then, and the disk and remote backends assert that one exists
        lmcache_log("Failed to initialize LMCacheManager components: AssertionError: Remote backend requires local "
                    "CPU backend as a buffer.Please turn on local cpu backend with max_local_cpu_size > 0 (simulated: "
                    f"max_local_cpu_size={lm.max_local_cpu_size:g}). System will operate in degraded mode "
                    "(recompute).", level="ERROR", where="manager.py:107:lmcache.v1.manager",
                    prefix=worker_prefix(0, config.tensor_parallel))
        config.lmcache = None
    if config.cold_start:
        cold_start(config)
    server = SimServer(config)
    vllm_log("INFO", describe(server))
    server.startup_lines()
    app = build_app(server)
    loop = asyncio.new_event_loop()
    server.watch(loop)
    try:
        web.run_app(app, host=config.host, port=config.port, print=lambda message: vllm_log("INFO", message),
                    access_log=None, handle_signals=True, loop=loop)
    except OSError as error:
        print(f"ERROR: cannot listen on {config.host}:{config.port}: {error.strerror or error}", file=sys.stderr,
              flush=True)
        raise SystemExit(1) from None
