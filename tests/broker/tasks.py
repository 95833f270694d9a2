"""A task for the broker tests: it appends its key to the file FXPILOT_BROKER_TEST_OUT names."""
from __future__ import annotations

import os
import time

from celery import shared_task


@shared_task(name="tests.broker.record")
def record(key: str, sleep: float = 0.0) -> None:
    if sleep:
        time.sleep(sleep)
    # One write of one short line with O_APPEND: lines of concurrent pool processes never interleave.
    fd = os.open(os.environ["FXPILOT_BROKER_TEST_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{key}\n".encode())
    finally:
        os.close(fd)
