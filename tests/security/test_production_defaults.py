"""Production defaults: HTTPS redirect and HSTS, a shared session store, JSON refusals from the API."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRINT = ("from django.conf import settings as s; import json; print(json.dumps({k: str(getattr(s, k, None)) for k in "
         "['SECURE_SSL_REDIRECT', 'SECURE_HSTS_SECONDS', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', 'DEBUG', "
         "'SESSION_ENGINE', 'SECURE_PROXY_SSL_HEADER']} | {'CACHE': s.CACHES['default']['BACKEND']}))")


def _settings(tmp_path, **env) -> dict:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "SECRET_KEY", "DEBUG", "FXPILOT_CACHE_URL")}
    environ.update({"FXPILOT_DATA_DIR": str(tmp_path), "FXPILOT_ENV": "development"}, **env)
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", PRINT], cwd=ROOT, env=environ,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_production_redirects_to_https_sends_hsts_and_secures_cookies(tmp_path):
    values = _settings(tmp_path, FXPILOT_ENV="production", SECRET_KEY="k" * 50, ALLOWED_HOSTS="pilot.example.com",
                       CELERY_BROKER_URL="redis://127.0.0.1:6379/9")
    assert values["SECURE_SSL_REDIRECT"] == "True"
    assert int(values["SECURE_HSTS_SECONDS"]) >= 180 * 24 * 3600
    assert values["SESSION_COOKIE_SECURE"] == values["CSRF_COOKIE_SECURE"] == "True"
    assert values["DEBUG"] == "False"
    # The broker's Redis is the shared cache unless another is named.
    assert values["CACHE"] == "fxpilot.cache.PrefixedRedisCache"
    assert values["SESSION_ENGINE"] == "django.contrib.sessions.backends.cached_db"


def test_without_a_shared_cache_sessions_live_in_the_database(tmp_path):
    values = _settings(tmp_path)
    assert values["SESSION_ENGINE"] == "django.contrib.sessions.backends.db"
    assert values["SECURE_SSL_REDIRECT"] in ("False", "None")


def test_a_cache_url_that_is_not_redis_stops_start_up_naming_the_variable(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    environ.update(FXPILOT_DATA_DIR=str(tmp_path), FXPILOT_ENV="development", FXPILOT_CACHE_URL="memcached://x:11211")
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=environ, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode != 0 and "FXPILOT_CACHE_URL" in result.stderr and "Traceback" not in result.stderr


def test_the_prefixed_redis_cache_clears_only_its_own_keys():
    import uuid

    import pytest
    import redis

    from fxpilot.cache import PrefixedRedisCache

    url = os.environ.get("CELERY_BROKER_URL", "")
    url = url if url.startswith("redis://") else "redis://127.0.0.1:6379/0"
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip("no Redis")
    prefix = f"fxpilot-test-{uuid.uuid4().hex[:8]}"
    other = f"{prefix}-not-ours"
    client.set(other, b"queued work", ex=60)
    cache = PrefixedRedisCache(url, {"KEY_PREFIX": prefix})
    cache.set("a", 1)
    cache.set("b", 2)
    cache.clear()
    assert cache.get("a") is None and cache.get("b") is None
    assert client.get(other) == b"queued work"
    client.delete(other)


def test_the_api_answers_a_wrong_method_and_a_missing_token_in_json(demo):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    for method in ("post", "put", "delete", "patch"):
        response = getattr(client, method)("/api/v1/pilots")
        assert response.status_code == 405 and response["Content-Type"] == "application/json", method
        assert "read-only" in response.json()["error"] and response["Allow"] == "GET, HEAD"
    assert client.get("/api/v1/pilots").json()["error"].startswith("authenticate")


def test_a_refused_csrf_check_under_the_api_answers_json(rf):
    from portal.middleware import csrf_failure

    response = csrf_failure(rf.post("/api/v1/anything"), reason="CSRF cookie not set.")
    assert response.status_code == 403 and "CSRF cookie not set" in json.loads(response.content)["error"]
    assert "text/html" in csrf_failure(rf.post("/pilots/"), reason="x")["Content-Type"]
