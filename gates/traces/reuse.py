"""The hits a trace allows, counted as vLLM's prefix cache counts them, for an unbounded cache and an LRU cache
of any capacity, in one pass (Mattson's stack distances).

The definitions (issue 24; `gates.traces.reference` states them in plain Python):

* requests in arrival order, equal timestamps in file order;
* a request hits the longest run of its leading blocks already cached — the run stops at the first block
  not present — and its hit tokens are `min(run × block_tokens, input_length)`;
* `hit_fraction` = hit tokens ÷ input tokens; ideal: an unbounded cache;
* LRU with a cache of `capacity_tokens // block_tokens` blocks: after the lookup, every block of the request
  is inserted or refreshed as most recently used, in the request's block order.

How it is computed. A block is in an LRU cache of C blocks exactly when fewer than C distinct blocks were
used after its last use (its stack distance d < C). A request's run at capacity C is therefore the number
of leading blocks whose running maximum of d stays below C. Since d only grows as the last use moves back,
that running maximum changes only where the running minimum of the last-use positions does: a request needs
a distance only at those few "records" (usually one: the block its session last used first). Each distance
is a count of distinct blocks used in a window (p, s) — the tail of the request that last used the block,
counted directly, plus the requests in between, counted over request-level events (how many blocks request u
brought back from request t) with a wavelet matrix: O((N + E) log R) with numpy, N block references,
E ≤ N events, R requests. Every capacity is then a threshold on the records' distances.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CHUNK = 1 << 20     # references per slice where a whole-trace temporary would cost memory (tests lower it)


@dataclass
class ReuseProfile:
    """What one pass over a trace's blocks yields; every capacity's hits follow from it."""

    block_tokens: int
    requests: int
    input_tokens: int
    ideal_hits: np.ndarray          # int64 per request (arrival order): hit tokens with an unbounded cache
    order: np.ndarray               # int64: arrival order → file index
    rec_request: np.ndarray         # int64 request (arrival index) of each record
    rec_distance: np.ndarray        # int64 stack distance in blocks
    rec_tokens: np.ndarray          # int64 hit tokens that need capacity > distance
    run_source: np.ndarray          # int64 per request: arrival index of the request that last held the
    #                                 first block of its hit run, −1 when nothing hits
    last_holder: np.ndarray         # int64 per request: arrival index of the request that last held the
    #                                 last block of its hit run, −1 when nothing hits
    run_blocks: np.ndarray          # int64 per request: leading blocks already seen (the ideal run)
    reuse_seconds: np.ndarray       # float64 per record: time since the block's last use (for TTL curves)
    _sorted: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def ideal_hit_tokens(self) -> int:
        return int(self.ideal_hits.sum())

    def _cumulative(self) -> tuple[np.ndarray, np.ndarray]:
        if self._sorted is None:
            order = np.argsort(self.rec_distance, kind="stable")
            distances = self.rec_distance[order]
            cumulative = np.concatenate(([0], np.cumsum(self.rec_tokens[order])))
            self._sorted = (distances, cumulative)
        return self._sorted

    def lru_hit_tokens(self, capacity_blocks: int | np.ndarray) -> int | np.ndarray:
        """Hit tokens with an LRU cache of `capacity_blocks` blocks (array in, array out)."""
        distances, cumulative = self._cumulative()
        index = np.searchsorted(distances, np.asarray(capacity_blocks, dtype=np.int64), side="left")
        result = cumulative[index]
        return int(result) if np.ndim(result) == 0 else result

    def lru_hits_per_request(self, capacity_blocks: int) -> np.ndarray:
        keep = self.rec_distance < capacity_blocks
        return np.bincount(self.rec_request[keep], weights=self.rec_tokens[keep],
                           minlength=self.requests).astype(np.int64)

    def capacity_for(self, share: float) -> int | None:
        """The fewest blocks an LRU cache needs to get `share` of the ideal hit tokens (None: nothing hits)."""
        ideal = self.ideal_hit_tokens
        if ideal == 0:
            return None
        distances, cumulative = self._cumulative()
        want = share * ideal
        i = int(np.searchsorted(cumulative, want - 1e-9, side="left"))
        # cumulative[i] = tokens of the i smallest distances: capacity must exceed distances[i − 1]
        return int(distances[i - 1]) + 1 if i > 0 else 0

    def curve(self, points: int = 48) -> list[dict]:
        """(capacity in blocks, hit tokens) at log-spaced capacities up to the one that reaches the ideal."""
        distances, cumulative = self._cumulative()
        if distances.size == 0:
            return []
        top = int(distances[-1]) + 1
        grid = np.unique(np.geomspace(1, max(top, 1), num=points).astype(np.int64))
        hits = self.lru_hit_tokens(grid)
        return [{"capacity_blocks": int(c), "hit_tokens": int(h)} for c, h in zip(grid, hits, strict=True)]


def arrival_blocks(offsets: np.ndarray, ids: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and ids with the requests put in `order`."""
    counts = np.diff(offsets)
    if np.array_equal(order, np.arange(order.size)):
        return offsets, ids
    sorted_counts = counts[order]
    new_offsets = np.zeros(order.size + 1, dtype=np.int64)
    np.cumsum(sorted_counts, out=new_offsets[1:])
    shift = np.repeat(offsets[:-1][order] - new_offsets[:-1], sorted_counts)
    return new_offsets, ids[np.arange(ids.size, dtype=np.int64) + shift]


def profile(offsets: np.ndarray, ids: np.ndarray, input_tokens: np.ndarray, block_tokens: int,
            timestamps: np.ndarray) -> ReuseProfile:
    """One pass over a trace's blocks (file order in; arrival order inside)."""
    order = np.argsort(timestamps, kind="stable")
    offsets, ids = arrival_blocks(np.asarray(offsets, dtype=np.int64), np.asarray(ids), order)
    length = np.asarray(input_tokens, dtype=np.int64)[order]
    ts = np.asarray(timestamps, dtype=np.float64)[order]
    R, N = length.size, int(ids.size)
    counts = np.diff(offsets)
    idx = np.int32 if N < 2**31 - 2 and R < 2**31 - 2 else np.int64
    # (whole-trace arrays are made when needed and dropped when done: memory stays near 20 bytes a reference)

    # previous use of each reference's block
    prev_true = _neighbours(ids, idx)

    # the last use before the reference's own request (a block twice in one request is looked up once, before)
    start_of = np.repeat(offsets[:-1].astype(idx), counts)
    prev = prev_true.copy()
    inside = np.flatnonzero(prev >= start_of)
    while inside.size:
        prev[inside] = prev_true[prev[inside]]
        inside = inside[prev[inside] >= start_of[inside]]
    del start_of

    # the ideal run: leading blocks already seen
    unseen = np.flatnonzero(prev < 0)
    cut = counts.copy()
    if unseen.size:
        ureq = _request_of(unseen, offsets)
        first = np.ones(unseen.size, dtype=bool)
        first[1:] = ureq[1:] != ureq[:-1]
        cut[ureq[first]] = unseen[first] - offsets[ureq[first]]
        del ureq, first
    del unseen                       # (a reference per distinct block: large, and not needed past here)
    ideal = np.minimum(cut * block_tokens, length)

    run_total = int(cut.sum())
    run_first = np.zeros(R, dtype=np.int64)
    np.cumsum(cut[:-1], out=run_first[1:])
    in_run = np.repeat((offsets[:-1] - run_first).astype(idx), cut)
    in_run += np.arange(run_total, dtype=idx)
    run_req = np.repeat(np.arange(R, dtype=idx), cut)
    run_prev = prev[in_run]
    del prev
    # records: where the running minimum of the last-use position falls, request by request
    # (a running maximum of request × (N + 1) + (N − position): each request starts above the last)
    pmin = np.empty(run_total, dtype=idx)
    carry = -1
    for a in range(0, run_total, CHUNK):
        base = run_req[a:a + CHUNK].astype(np.int64) * (N + 1)
        key = base + (N - run_prev[a:a + CHUNK].astype(np.int64))
        np.maximum.accumulate(key, out=key)
        np.maximum(key, carry, out=key)
        carry = int(key[-1])
        pmin[a:a + CHUNK] = N - (key - base)
    is_rec = np.ones(run_total, dtype=bool)
    if run_total:
        is_rec[1:] = run_req[1:] != run_req[:-1]
        is_rec[1:] |= pmin[1:] != pmin[:-1]
    rec_k = in_run[is_rec].astype(np.int64)
    rec_r = run_req[is_rec].astype(np.int64)
    rec_p = pmin[is_rec].astype(np.int64)
    first_of_run = np.ones(in_run.size, dtype=bool)
    last_of_run = np.ones(in_run.size, dtype=bool)
    if in_run.size:
        first_of_run[1:] = run_req[1:] != run_req[:-1]
        last_of_run[:-1] = run_req[1:] != run_req[:-1]
    run_source = np.full(R, -1, dtype=np.int64)
    run_source[run_req[first_of_run]] = _request_of(run_prev[first_of_run], offsets)
    last_holder = np.full(R, -1, dtype=np.int64)
    last_holder[run_req[last_of_run]] = _request_of(run_prev[last_of_run], offsets)
    del in_run, run_req, run_prev, pmin, is_rec, first_of_run, last_of_run

    # each record's tokens: its blocks up to the next record (or the end of the run)
    rec_i = rec_k - offsets[rec_r]
    nxt = np.empty_like(rec_i)
    if rec_i.size:
        nxt[:-1] = np.where(rec_r[1:] == rec_r[:-1], rec_i[1:], cut[rec_r[:-1]])
        nxt[-1] = cut[rec_r[-1]]
    rec_tokens = np.minimum(nxt * block_tokens, length[rec_r]) - np.minimum(rec_i * block_tokens, length[rec_r])
    handed = [prev_true]             # handed over: _distances drops it before its last, largest step
    del prev_true
    distance = _distances(rec_r, rec_p, offsets, counts, handed, N)
    holder = _request_of(rec_p, offsets)
    reuse_seconds = ts[rec_r] - ts[holder] if rec_p.size else np.zeros(0)
    return ReuseProfile(block_tokens=block_tokens, requests=R, input_tokens=int(length.sum()), ideal_hits=ideal,
                        order=order, rec_request=rec_r, rec_distance=distance, rec_tokens=rec_tokens,
                        run_source=run_source, last_holder=last_holder, run_blocks=cut,
                        reuse_seconds=reuse_seconds)


def _neighbours(ids: np.ndarray, idx) -> np.ndarray:
    """The previous reference to the same block (−1 when none): one in-place sort of
    (block, position) packed into one integer (faster and smaller than an argsort)."""
    N = int(ids.size)
    if N == 0:
        return np.full(0, -1, dtype=idx)
    bits = max(1, N.bit_length())
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and high < (1 << (62 - bits)):
        key = ids.astype(np.int64)
    else:
        key = np.unique(ids, return_inverse=True)[1].astype(np.int64).reshape(-1)
    key <<= bits
    step = CHUNK                     # temporaries in slices: memory stays near one int64 per reference
    for a in range(0, N, step):
        key[a:a + step] |= np.arange(a, min(N, a + step), dtype=np.int64)
    key.sort(kind="stable")          # traces are mostly runs already: timsort/radix finds them
    same = np.empty(N - 1, dtype=bool)
    pos = np.empty(N, dtype=idx)
    for a in range(0, N, step):
        b = min(N, a + step)
        block = key[a:b] >> bits
        if b < N:
            same[a:b] = block == np.append(block[1:], key[b] >> bits)
        else:
            same[a:b - 1] = block[1:] == block[:-1]
        pos[a:b] = key[a:b] & ((1 << bits) - 1)
    del key
    prev_true = np.full(N, -1, dtype=idx)
    prev_true[pos[1:][same]] = pos[:-1][same]
    return prev_true


def _next_uses(prev_true: np.ndarray) -> np.ndarray:
    """The next reference to the same block (N when none), from the previous ones."""
    N = prev_true.size
    next_true = np.full(N, N, dtype=prev_true.dtype)
    for a in range(0, N, CHUNK):
        later = np.flatnonzero(prev_true[a:a + CHUNK] >= 0)
        next_true[prev_true[a + later]] = a + later
    return next_true


def _request_of(positions: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The request (arrival index) holding each reference position."""
    return np.searchsorted(offsets, np.asarray(positions, dtype=np.int64), side="right").astype(np.int64) - 1


def _distances(rec_r, rec_p, offsets, counts, handed: list[np.ndarray], N) -> np.ndarray:
    """Distinct blocks used in the window (p, start of r) for each record (r, p); `handed` holds the previous
    uses (taken out, so that they are freed before the wavelet count)."""
    prev_true = handed.pop()
    Q = rec_r.size
    if Q == 0:
        return np.zeros(0, dtype=np.int64)
    holder = _request_of(rec_p, offsets)             # r′: the request that last used the block
    j = rec_p - offsets[holder]                      # its offset there
    s = offsets[rec_r]
    req = np.repeat(np.arange(counts.size, dtype=prev_true.dtype), counts)

    # requests strictly between r′ and r: references whose block was last used before r′ (or never), as
    # request-level events (u, t, w): w references of request u whose block was last used in request t;
    # run-length coded slice by slice (a run cut at a slice edge is two events: the counts add up the same)
    R = counts.size
    pieces_u, pieces_t, pieces_w = [], [], []
    for a in range(0, N, CHUNK):
        b = min(N, a + CHUNK)
        u = req[a:b]
        prior = prev_true[a:b]
        t = req[np.maximum(prior, 0)]
        t[prior < 0] = -1
        change = np.ones(b - a, dtype=bool)
        change[1:] = (u[1:] != u[:-1]) | (t[1:] != t[:-1])
        starts = np.flatnonzero(change)
        pieces_u.append(u[starts])
        pieces_t.append(t[starts])
        pieces_w.append(np.diff(np.append(starts, b - a)).astype(req.dtype))
    dtype = req.dtype
    del req
    ev_u = np.concatenate(pieces_u) if pieces_u else np.zeros(0, dtype=dtype)
    ev_t = np.concatenate(pieces_t) if pieces_t else np.zeros(0, dtype=dtype)
    ev_w = np.concatenate(pieces_w) if pieces_w else np.zeros(0, dtype=dtype)
    del pieces_u, pieces_t, pieces_w
    ev_first = np.searchsorted(ev_u, np.arange(R + 1), side="left")
    del ev_u

    # the holder's own blocks: after the offset, first uses in the window; up to it, blocks used again between
    next_true = _next_uses(prev_true)
    own = np.zeros(Q, dtype=np.int64)
    n = counts[holder]
    step = max(1, int(CHUNK // 4 // max(1, int(n.max()))))
    for a in range(0, Q, step):
        b = min(Q, a + step)
        reps = n[a:b]
        total = int(reps.sum())
        if total == 0:
            continue
        which = np.repeat(np.arange(b - a), reps)
        first = np.concatenate(([0], np.cumsum(reps)[:-1]))
        o = np.arange(total, dtype=np.int64) - first[which]
        pos = offsets[holder[a:b]][which] + o
        after = o > j[a:b][which]
        counted = np.where(after, prev_true[pos] <= rec_p[a:b][which],
                           (next_true[pos] >= offsets[holder[a:b] + 1][which]) & (next_true[pos] < s[a:b][which]))
        own[a:b] = np.bincount(which, weights=counted, minlength=b - a).astype(np.int64)
    del next_true, prev_true
    between = count_less(ev_t + 1, ev_w, ev_first[holder + 1], ev_first[rec_r], holder + 1)
    return between + own


def count_less(values: np.ndarray, weights: np.ndarray, lo: np.ndarray, hi: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """For each query i: Σ weights[k] for lo[i] ≤ k < hi[i] with values[k] < xs[i] (values, xs ≥ 0).

    A wavelet matrix built and queried level by level (top bit first), so only one level is held at a time.
    """
    small = values.size < 2**31 - 1 and int(np.sum(weights, dtype=np.int64)) < 2**31 - 1
    kind = np.int32 if small else np.int64       # half the memory and bandwidth when it fits
    values = np.asarray(values, dtype=kind)
    weights = np.asarray(weights, dtype=kind)
    xs = np.asarray(xs, dtype=np.int64)
    b = np.asarray(lo, dtype=np.int64).copy()
    e = np.maximum(np.asarray(hi, dtype=np.int64), b)
    result = np.zeros(xs.size, dtype=np.int64)
    if values.size == 0 or xs.size == 0:
        return result
    top = int(max(values.max(), xs.max())).bit_length()
    for level in range(top - 1, -1, -1):
        bit = ((values >> level) & 1).astype(bool)
        zero = ~bit
        zeros = np.zeros(values.size + 1, dtype=kind)
        np.cumsum(zero, out=zeros[1:])
        wz = np.zeros(values.size + 1, dtype=kind)
        np.cumsum(weights * zero, out=wz[1:])
        z = zeros[-1]
        x_one = ((xs >> level) & 1).astype(bool)
        zb, ze = zeros[b], zeros[e]
        result += np.where(x_one, wz[e] - wz[b], 0)
        b = np.where(x_one, z + b - zb, zb)
        e = np.where(x_one, z + e - ze, ze)
        values = np.concatenate((values[zero], values[bit]))
        weights = np.concatenate((weights[zero], weights[bit]))
    return result
