"""The shared cache on Redis: Django's own backend, except that clearing it removes only fxpilot's keys.

Django's RedisCache.clear() empties the whole Redis database, which on a server shared with the Celery
broker would also drop queued work; this one deletes the keys under its own prefix and nothing else.
"""
from __future__ import annotations

from django.core.cache.backends.redis import RedisCache


class PrefixedRedisCache(RedisCache):
    def clear(self) -> bool:
        client = self._cache.get_client(None, write=True)
        pattern = f"{self.key_prefix}:*" if self.key_prefix else "*"
        batch = []
        for key in client.scan_iter(match=pattern, count=500):
            batch.append(key)
            if len(batch) >= 500:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
        return True
