"""Wake a waiting process now, over the broker's Redis, instead of having it ask the database ten times a second.

The agent API's long poll (runners.agentapi.work) waits up to 20 s for its site's next call. It used to look in
the database every 0.1 s, two queries each time, for as long as an agent was connected: twenty queries a second
per agent, day and night, and the busiest process of a demo after the simulated servers. Now the process that
queues a call says so (`notify`), and the poll waits on that word (`wait`), looking in the database when woken and
at least once a second otherwise. The database stays the truth: a lost or late word costs at most that second,
never a call; a word with no waiter is kept a short while, so a poll that starts just after it wakes at once.

Redis is the broker's (CELERY_BROKER_URL: TCP or the embedded server's Unix socket). Without it (another broker, or
Redis down for a moment) `wait` sleeps the short fallback and says it was not woken: the caller looks anyway.
"""
from __future__ import annotations

import logging
import threading
import time

from django.conf import settings

from infra.broker import socket_of

logger = logging.getLogger(__name__)

PREFIX = "fxpilot:wake:"
KEEP_SECONDS = 30  # an unheard word is dropped after this long
FALLBACK_SECONDS = 0.1  # how long `wait` sleeps when Redis cannot carry the word

_client = None
_client_url: str | None = None
_lock = threading.Lock()


def _redis():
    """One client per process (redis-py's pool is thread-safe), for the broker URL of the moment; None if the broker
    is not Redis."""
    global _client, _client_url
    url = settings.CELERY_BROKER_URL or ""
    with _lock:
        if _client is not None and _client_url == url:
            return _client
        import redis

        sock = socket_of(url)
        if sock is not None:
            client = redis.Redis(unix_socket_path=str(sock), socket_timeout=30, socket_connect_timeout=2)
        elif url.startswith(("redis://", "rediss://")):
            client = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=2)
        else:
            client = None
        _client, _client_url = client, url
        return client


def notify(name: str) -> bool:
    """Wake one waiter on `name` (or the next one to wait within KEEP_SECONDS). False if the word could not be
    sent; the waiter then finds the news on its next look, as it would have before."""
    client = _redis()
    if client is None:
        return False
    key = PREFIX + name
    try:
        with client.pipeline(transaction=False) as pipe:
            pipe.lpush(key, 1).ltrim(key, 0, 0).expire(key, KEEP_SECONDS).execute()
        return True
    except Exception as exc:  # noqa: BLE001 — any Redis trouble: the waiter looks in the database anyway
        logger.debug("wake-up %s not sent: %s", name, exc)
        return False


def wait(name: str, timeout: float) -> bool:
    """Wait at most `timeout` seconds for a word on `name`; True if one came. Without Redis, sleeps at most
    FALLBACK_SECONDS and returns False."""
    client = _redis()
    if client is not None and timeout >= 0.01:
        try:
            # BLPOP takes a float timeout (Redis ≥ 6); 0 would mean forever
            return client.blpop([PREFIX + name], timeout=max(timeout, 0.01)) is not None
        except Exception as exc:  # noqa: BLE001 — fall back to the short sleep below
            logger.debug("wake-up %s not awaited: %s", name, exc)
    time.sleep(max(0.0, min(timeout, FALLBACK_SECONDS)))
    return False
