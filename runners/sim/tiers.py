"""The prefix index of the simulated server: HBM (vLLM prefix cache), host DRAM, local disk, fs pool.

A prompt is cut into chunks; a chunk is identified by a hash chained over every token up to its end,
so a chunk matches only when the whole prefix before it matches (as vLLM's block hashes and
LMCache's chunk keys do). HBM and DRAM are in-memory LRU sets. The disk tier and the ``fs`` pool
keep one small file per chunk — the key and its logical size, not the KV bytes — so they survive a
restart and an ``fs`` pool on a shared mount is seen by every instance that mounts it.
"""
from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def token_bytes(tokens: Sequence[int]) -> bytes:
    return array("I", [t & 0xFFFFFFFF for t in tokens]).tobytes()


def chunk_keys(tokens: Sequence[int] | bytes, chunk: int, seed: str) -> list[str]:
    """Hex key of every full chunk: hash(key of the previous chunk, this chunk's tokens)."""
    data = tokens if isinstance(tokens, bytes) else token_bytes(tokens)
    step = chunk * 4
    previous = hashlib.blake2b(seed.encode(), digest_size=16).digest()
    keys = []
    for start in range(0, (len(data) // step) * step, step):
        previous = hashlib.blake2b(previous + data[start:start + step], digest_size=16).digest()
        keys.append(previous.hex())
    return keys


class Writer:
    """Tier files are written and removed off the request path, in order, by one thread."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tier-writer")

    def submit(self, function, *args) -> None:
        self.pool.submit(_quietly, function, *args)

    def flush(self) -> None:
        self.pool.submit(lambda: None).result()


def _quietly(function, *args) -> None:
    try:
        function(*args)
    except OSError as error:
        print(f"LMCache WARNING: tier file operation failed: {error}", flush=True)


def _write(path: Path, data: bytes) -> None:
    """Whole or absent (a temporary file renamed into place), with the system calls themselves: pathlib's open and
    write_bytes were a third of a simulated server's CPU under G3's load."""
    final = os.fspath(path)
    folder, name = os.path.split(final)
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(temporary, final)


def _apply(writes: list[Path], removes: list[Path], data: bytes) -> None:
    """One batch per store: a chunk evicted by the same batch that wrote it ends up absent, as in the index."""
    for path in writes:
        _write(path, data)
    for path in removes:
        path.unlink(missing_ok=True)


class LruTier:
    """A set of keys with a capacity in entries; touching a key makes it the most recent."""

    def __init__(self, name: str, capacity: int):
        self.name = name
        self.capacity = max(int(capacity), 0)
        self.entries: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def touch(self, key: str) -> None:
        self.entries.move_to_end(key)

    def put(self, key: str) -> bool:
        """Insert (or refresh) ``key``; True when it was new."""
        return self.put_many([key]) == 1

    def _insert(self, key: str) -> bool:
        if self.capacity <= 0:
            return False
        if key in self.entries:
            self.entries.move_to_end(key)
            return False
        self.entries[key] = None
        while len(self.entries) > self.capacity:
            self._evict(self.entries.popitem(last=False)[0])
        return True

    def put_many(self, keys: list[str]) -> int:
        """Insert every key in order; returns how many were new."""
        added = [key for key in keys if self._insert(key)]
        self._flush(added)
        return len(added)

    def clear(self) -> None:
        self.entries.clear()

    def visible(self, key: str, now: float) -> bool:
        """Whether a lookup at model time ``now`` finds ``key`` (tiers written asynchronously override it)."""
        return key in self

    def _evict(self, key: str) -> None:
        """Hook for tiers that hold something outside memory."""

    def _flush(self, added: list[str]) -> None:
        """Hook: make ``added`` (and what was evicted meanwhile) durable."""


class DramTier(LruTier):
    """LMCache's ``LocalCPUBackend`` hot cache with ``local_cpu: true``: an LRU of whole chunks, one copy per TP rank.

    Every rank's worker runs its own LMCache engine with its own DRAM; a store or a promotion writes a chunk on every
    rank. Each entry remembers which ranks hold it (a bit per rank), so the internal API server of one worker empties
    that rank's DRAM only. A lookup finds a chunk in DRAM when every rank holds it (a chunk some rank lost is read
    from the disk tier, for every rank: a simplification of a partial clear).
    """

    def __init__(self, name: str, capacity: int, ranks: int):
        super().__init__(name, capacity)
        self.full = (1 << max(int(ranks), 1)) - 1
        self.entries: OrderedDict[str, int] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return self.entries.get(key) == self.full

    def __len__(self) -> int:
        return len(self.entries)

    def _insert(self, key: str) -> bool:
        if self.capacity <= 0:
            return False
        held = self.entries.get(key)
        self.entries[key] = self.full
        self.entries.move_to_end(key)
        if held is None:
            while len(self.entries) > self.capacity:
                self.entries.popitem(last=False)
        return held != self.full

    def clear_rank(self, rank: int) -> int:
        """Empty one rank's DRAM (LocalCPUBackend.clear on that worker); returns the chunks it held."""
        bit = 1 << rank
        removed = 0
        for key in list(self.entries):
            mask = self.entries[key]
            if mask & bit:
                removed += 1
                if mask == bit:
                    del self.entries[key]
                else:
                    self.entries[key] = mask & ~bit
        return removed


class DiskTier(LruTier):
    """LMCache ``local_disk``: one file per chunk under ``path``, LRU within ``capacity`` chunks.

    On start the index is rebuilt from the files already there (oldest first), so a restart on a
    persistent path keeps its entries.
    """

    suffix = ".pt"

    def __init__(self, name: str, path: Path, capacity: int, chunk_tokens: int, rank_bytes: int, writer: Writer):
        super().__init__(name, capacity)
        self.path = path
        self.writer = writer
        self.doomed: list[Path] = []
        # chunks whose write is still in flight: model time at which it completes (LocalDiskBackend inserts a key
        # into its index only once async_save_bytes_to_disk has written the file)
        self.ready: dict[str, float] = {}
        self.meta = json.dumps({"tokens": chunk_tokens, "bytes_per_rank": rank_bytes, "simulated": True}).encode()
        path.mkdir(parents=True, exist_ok=True)
        found = sorted(self.path.glob("*" + self.suffix), key=lambda p: p.stat().st_mtime)
        for file in found:
            self.entries[file.name[: -len(self.suffix)]] = None
        while len(self.entries) > self.capacity:
            self._evict(self.entries.popitem(last=False)[0])
        self._flush([])

    def _file(self, key: str) -> Path:
        return self.path / (key + self.suffix)

    def visible(self, key: str, now: float) -> bool:
        if key not in self.entries:
            return False
        due = self.ready.get(key)
        if due is None:
            return True
        if due > now:
            return False
        del self.ready[key]
        return True

    def put_many(self, keys: list[str], ready: dict[str, float] | None = None) -> int:
        """Insert every key in order (an insert reserves its space and evicts at once, as LocalDiskBackend's
        submit_put_task does); a new key is found by lookups only from its time in ``ready`` (its write done)."""
        added = [key for key in keys if self._insert(key)]
        if ready:
            for key in added:
                if key in ready and key in self.entries:
                    self.ready[key] = ready[key]
        self._flush(added)
        return len(added)

    def clear(self) -> None:
        for key in self.entries:
            self._evict(key)
        super().clear()
        self.ready.clear()
        self._flush([])

    def _evict(self, key: str) -> None:
        self.ready.pop(key, None)
        self.doomed.append(self._file(key))

    def _flush(self, added: list[str]) -> None:
        removes, self.doomed = self.doomed, []
        if added or removes:
            self.writer.submit(_apply, [self._file(key) for key in added], removes, self.meta)


class FsPool:
    """LMCache ``fs`` remote backend: ``<key>.data`` files under a base path shared by instances.

    Lookups ask the file system, not memory, so what another instance wrote is found. No eviction:
    the pool is sized by the array, as LMCache's fs connector leaves it to the operator.
    """

    suffix = ".data"

    def __init__(self, name: str, path: Path, chunk_tokens: int, rank_bytes: int, writer: Writer):
        self.name = name
        self.path = path
        self.writer = writer
        self.written: set[str] = set()
        self.ready: dict[str, float] = {}     # this instance's writes in flight: model time each completes
        self.meta = json.dumps({"tokens": chunk_tokens, "bytes_per_rank": rank_bytes, "simulated": True}).encode()
        path.mkdir(parents=True, exist_ok=True)

    def __contains__(self, key: str) -> bool:
        return key in self.written or os.path.exists(self.path / (key + self.suffix))

    def visible(self, key: str, now: float) -> bool:
        due = self.ready.get(key)
        if due is not None:
            if due > now:
                return False
            del self.ready[key]
            return True
        return key in self

    def touch(self, key: str) -> None:
        """Reads do not reorder a pool without eviction."""

    def put_many(self, keys: list[str], ready: dict[str, float] | None = None) -> int:
        added = [key for key in keys if key not in self]
        if added:
            self.written.update(added)
            if ready:
                self.ready.update((key, ready[key]) for key in added if key in ready)
            self.writer.submit(_apply, [self.path / (key + self.suffix) for key in added], [], self.meta)
        return len(added)

    def __len__(self) -> int:
        return sum(1 for _ in self.path.glob("*" + self.suffix))
