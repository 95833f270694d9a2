"""Settings come from the environment and a bad value stops start-up naming the variable."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fxpilot.env import SettingError, check_broker_url, database_from_url

ROOT = Path(__file__).resolve().parents[2]


def _check(tmp_path, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "SECRET_KEY", "DEBUG")}
    environ.update({"FXPILOT_DATA_DIR": str(tmp_path), "FXPILOT_ENV": "development"}, **env)
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"DEBUG": "maybe"}, "DEBUG"),
        ({"DATABASE_URL": "mysql://x/y"}, "DATABASE_URL"),
        ({"CELERY_BROKER_URL": "sqs://queue"}, "CELERY_BROKER_URL"),
        ({"FXPILOT_ENV": "production", "ALLOWED_HOSTS": "pilot.example.com"}, "SECRET_KEY"),
        ({"FXPILOT_ENV": "production", "SECRET_KEY": "x" * 50}, "ALLOWED_HOSTS"),
        ({"FXPILOT_ENV": "staging"}, "FXPILOT_ENV"),
    ],
)
def test_a_bad_setting_stops_start_up_naming_the_variable(tmp_path, env, named):
    result = _check(tmp_path, **env)
    assert result.returncode != 0
    assert named in result.stderr
    assert "Traceback" not in result.stderr


def test_the_embedded_default_generates_a_secret_once(tmp_path):
    assert _check(tmp_path).returncode == 0
    secret = (tmp_path / "secret_key").read_text()
    assert _check(tmp_path).returncode == 0
    assert (tmp_path / "secret_key").read_text() == secret and len(secret) >= 50


def test_database_urls_are_parsed_strictly(tmp_path):
    sqlite = database_from_url("DATABASE_URL", "sqlite:///var/x.sqlite3", tmp_path)
    assert sqlite["NAME"] == str(tmp_path / "var/x.sqlite3")
    pg = database_from_url("DATABASE_URL", "postgres://fx:s%40cret@db.local:5433/fxpilot?sslmode=require", tmp_path)
    assert (pg["ENGINE"], pg["USER"], pg["PASSWORD"], pg["HOST"], pg["PORT"], pg["NAME"]) == (
        "django.db.backends.postgresql", "fx", "s@cret", "db.local", "5433", "fxpilot")
    assert pg["OPTIONS"] == {"sslmode": "require"}
    with pytest.raises(SettingError, match="names no database"):
        database_from_url("DATABASE_URL", "postgres://fx:secret@db.local/", tmp_path)
    with pytest.raises(SettingError) as error:
        database_from_url("DATABASE_URL", "postgres://fx:secret@db.local:port/x", tmp_path)
    assert "secret" not in str(error.value)


def test_broker_urls_accept_the_embedded_default_redis_and_amqp():
    for url in ("redis+socket:///srv/fxpilot/var/redis/redis.sock", "redis://localhost:6379/0", "amqp://guest@localhost//"):
        assert check_broker_url("CELERY_BROKER_URL", url) == url
    with pytest.raises(SettingError, match="CELERY_BROKER_URL"):
        check_broker_url("CELERY_BROKER_URL", "kafka://x")
    # The filesystem transport can hand a worker an empty message: refused, naming the way out.
    with pytest.raises(SettingError, match="filesystem broker is not supported.*leave it unset"):
        check_broker_url("CELERY_BROKER_URL", "filesystem://")
