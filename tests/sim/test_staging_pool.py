"""LMCache 0.5.6's CPU pool as the engine models it: a retrieval stages every disk chunk before reading any, beside the
DRAM chunks its step's lookups pinned (docs/simulator.md, "The staging pool")."""
from __future__ import annotations

from runners.sim.engine import Engine, SimRequest

CONTEXT = 49152            # 192 chunks
TOKENS = CONTEXT + 256


def engine(capacity: int, events: list) -> Engine:
    return Engine(staging_capacity=capacity, listener=lambda request, kind, now, info: events.append((kind, now, info)))


def disk_return(rid: str) -> SimRequest:
    return SimRequest(rid=rid, prompt_tokens=TOKENS, output_tokens=2, cached_disk=CONTEXT, disk_device="fx",
                      staging_chunks=192, store=True)


def dram_return(rid: str) -> SimRequest:
    return SimRequest(rid=rid, prompt_tokens=TOKENS, output_tokens=2, cached_dram=CONTEXT, pinned_chunks=192,
                      store=True)


def test_a_retrieval_that_fits_the_pool_does_not_wait():
    events: list = []
    alone = engine(300, events)
    request = disk_return("b")
    alone.submit(request)
    alone.run_until_idle()
    assert request.state == "done" and request.first_token_at < 30
    assert not [e for e in events if e[0] == "stalled"]


def test_other_requests_pins_hold_a_retrieval_until_the_pin_monitor_forces_them_off():
    events: list = []
    step = engine(300, events)
    pinned, staged = dram_return("a"), disk_return("b")
    step.submit(SimRequest(rid="busy", prompt_tokens=16, output_tokens=1))  # both wait for its step: one step admits them
    step.submit(pinned)
    step.submit(staged)
    step.run_until_idle()
    stalls = [info for kind, _, info in events if kind == "stalled"]
    # 192 pinned + 192 staged > 300: the pins, taken at t = 0, are forced off at the first check after 300 s (330 s)
    assert len(stalls) == 1 and stalls[0]["until"] == 330.0 and stalls[0]["request"] is staged
    assert staged.first_token_at >= 330.0 and pinned.first_token_at >= 330.0
    assert staged.state == pinned.state == "done"


def test_own_dram_and_disk_chunks_above_the_pool_stall_the_engine_for_ever():
    events: list = []
    step = engine(300, events)
    request = SimRequest(rid="c", prompt_tokens=TOKENS, output_tokens=2, cached_dram=96 * 256, cached_disk=96 * 256,
                         pinned_chunks=96, staging_chunks=96 + 120, store=True)
    step.submit(request)
    step.advance_to(10_000.0)
    assert step.stall is not None and step.stall["request"] is request
    assert request.first_token_at is None and not step.idle()
    assert sum(1 for kind, _, _ in events if kind == "stalled") >= 100   # it keeps saying so
