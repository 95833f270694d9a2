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


def tiered_hit_tokens(timestamps: Sequence[float], input_tokens: Sequence[int], blocks: Sequence[Sequence],
                      block_tokens: int, hbm_tokens: int, dram_tokens: int,
                      fx_tokens: int | None = None) -> tuple[int, int, int]:
    """(HBM, DRAM, FX) hit tokens of the cascade gates.traces.tiers states: HBM an LRU over every request's blocks;
    DRAM an LRU over the blocks after the HBM run; FX (unbounded when fx_tokens is None) over the blocks after the
    DRAM run. Each level looks up first (its run continues the run above), then inserts or refreshes what it saw."""
    levels = [OrderedDict(), OrderedDict(), OrderedDict()]
    sizes = [hbm_tokens // block_tokens, dram_tokens // block_tokens,
             None if fx_tokens is None else fx_tokens // block_tokens]
    served = [0, 0, 0]
    for i in arrival_order(timestamps):
        request = list(blocks[i])
        start = 0
        done = 0
        for level, cache in enumerate(levels):
            seen = request[start:]
            run = 0
            for block in seen:
                if block not in cache:
                    break
                run += 1
            upto = min((start + run) * block_tokens, input_tokens[i])
            served[level] += max(0, upto - done)
            done = max(done, upto)
            if sizes[level] != 0:
                for block in seen:
                    cache[block] = None
                    cache.move_to_end(block)
                while sizes[level] is not None and len(cache) > sizes[level]:
                    cache.popitem(last=False)
            start += run
    return served[0], served[1], served[2]
