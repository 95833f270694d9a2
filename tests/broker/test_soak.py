"""The broker under load: producers and consumers in separate processes, thousands of messages while
other processes keep both cores busy — every message delivered exactly once, no worker exits."""
from __future__ import annotations

import subprocess
import sys
import time

PRODUCERS, PER_PRODUCER = 4, 750


def test_thousands_of_messages_under_cpu_contention_none_lost_none_twice(procs):
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        workers = [procs.worker(f"soak{i}", "soak-q", concurrency=2) for i in (1, 2)]
        keys = {p: [f"p{p}-{i}" for i in range(PER_PRODUCER)] for p in range(PRODUCERS)}
        started = time.monotonic()
        producers = [procs.producer(f"producer{p}", "soak-q", keys[p]) for p in keys]
        for producer in producers:
            assert producer.wait(600) == 0, producer.log.read_text(errors="replace")[-2000:]
        expected = {key for batch in keys.values() for key in batch}
        seen = procs.wait_deliveries(expected, 600)
        elapsed = time.monotonic() - started
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    lost = expected - set(seen)
    twice = {key: n for key, n in seen.items() if n > 1}
    assert not lost, f"{len(lost)} lost of {len(expected)}, e.g. {sorted(lost)[:10]}"
    assert not twice, f"{len(twice)} delivered more than once, e.g. {list(twice.items())[:10]}"
    assert set(seen) == expected
    for worker in workers:
        log = worker.log.read_text(errors="replace")
        assert worker.poll() is None and "Unrecoverable" not in log and "WorkerLostError" not in log, log[-3000:]
    # Both consumers took part.
    assert all(" succeeded in " in worker.log.read_text(errors="replace") for worker in workers)
    print(f"{len(expected)} messages through {len(workers)} workers in {elapsed:.1f} s under CPU contention")
