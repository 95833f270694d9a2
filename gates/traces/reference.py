"""The counting definitions of issue 24 in plain Python, one capacity at a time: the tests' oracle and the
benchmark's baseline for `gates.traces.reuse` (which must give the same numbers, much faster).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def arrival_order(timestamps: Sequence[float]) -> list[int]:
    """Requests in arrival order; equal timestamps keep file order (sorted() is stable)."""
    return sorted(range(len(timestamps)), key=lambda i: timestamps[i])


def ideal_hit_tokens(timestamps: Sequence[float], input_tokens: Sequence[int], blocks: Sequence[Sequence],
                     block_tokens: int) -> int:
    """Hit tokens with an unbounded cache."""
    cached: set = set()
    hits = 0
    for i in arrival_order(timestamps):
        run = 0
        for block in blocks[i]:
            if block not in cached:
                break
            run += 1
        hits += min(run * block_tokens, input_tokens[i])
        cached.update(blocks[i])
    return hits


def lru_hit_tokens(timestamps: Sequence[float], input_tokens: Sequence[int], blocks: Sequence[Sequence],
                   block_tokens: int, capacity_tokens: int) -> int:
    """Hit tokens with an LRU cache of capacity_tokens // block_tokens blocks: look up the leading run, then
    insert or refresh every block of the request as most recently used, in block order."""
    capacity = capacity_tokens // block_tokens
    cache: OrderedDict = OrderedDict()
    hits = 0
    for i in arrival_order(timestamps):
        run = 0
        for block in blocks[i]:
            if block not in cache:
                break
            run += 1
        hits += min(run * block_tokens, input_tokens[i])
        for block in blocks[i]:
            cache[block] = None
            cache.move_to_end(block)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits
