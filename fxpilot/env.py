"""Strict parsing of settings from environment variables.

A typo in a setting must stop start-up with a message that names the variable and what it
accepts, not surface at 3 a.m. as a strange behaviour.
"""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse


class SettingError(Exception):
    """A configuration value that cannot be used; the message names the variable."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def envstr(name: str, default: str | None = None, *, required: bool = False) -> str | None:
    value = os.environ.get(name)
    if value is None or value == "":
        if required:
            raise SettingError(f"{name} is required here and is not set.")
        return default
    return value


def envbool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SettingError(f"{name}={value!r} is not a boolean; use one of true/false, 1/0, yes/no, on/off.")


def envint(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise SettingError(f"{name}={value!r} is not an integer.") from None
    if minimum is not None and number < minimum:
        raise SettingError(f"{name}={number} is below the minimum {minimum}.")
    if maximum is not None and number > maximum:
        raise SettingError(f"{name}={number} is above the maximum {maximum}.")
    return number


def envfloat(name: str, default: float, *, minimum: float | None = None) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = float(value.strip())
    except ValueError:
        raise SettingError(f"{name}={value!r} is not a number.") from None
    if minimum is not None and number < minimum:
        raise SettingError(f"{name}={number} is below the minimum {minimum}.")
    return number


def envchoice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value not in choices:
        raise SettingError(f"{name}={value!r} is not one of: {', '.join(choices)}.")
    return value


def envlist(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def database_from_url(name: str, url: str, base_dir: Path) -> dict:
    """Turn `sqlite:///path` or `postgres://user:pass@host:port/db` into a Django DATABASES entry."""
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        path = unquote(parsed.path)
        if parsed.netloc:
            raise SettingError(f"{name}={url!r}: write SQLite URLs as sqlite:///relative/path or sqlite:////absolute/path.")
        if path.startswith("//"):
            db_path = Path(path[1:])
        else:
            db_path = base_dir / path.lstrip("/")
        if not path.strip("/"):
            raise SettingError(f"{name}={url!r} names no SQLite file.")
        return {
            "ENGINE": "fxpilot.sqlite3",  # Django's, with a flush the freeze triggers allow
            "NAME": str(db_path),
            # A file, not memory: Celery workers started by the tests must see the test database.
            "TEST": {"NAME": str(db_path.with_name(f"test_{db_path.name}"))},
            "CONN_MAX_AGE": 60,
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE",
                        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"},
        }
    if parsed.scheme in ("postgres", "postgresql"):
        dbname = unquote(parsed.path.lstrip("/"))
        if not dbname:
            raise SettingError(f"{name}={_redact(url)!r} names no database (postgres://user:password@host:port/DATABASE).")
        try:
            port = parsed.port
        except ValueError:
            raise SettingError(f"{name}={_redact(url)!r} has a port that is not a number.") from None
        options = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": dbname,
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": unquote(parsed.hostname or ""),
            "PORT": str(port or ""),
            "OPTIONS": options,
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    raise SettingError(f"{name}={_redact(url)!r}: the scheme must be sqlite:// or postgres:// (postgresql://).")


def check_broker_url(name: str, url: str) -> str:
    scheme = urlparse(url).scheme
    if scheme == "filesystem":
        raise SettingError(f"{name}={url!r}: the filesystem broker is not supported (it can hand a worker an empty "
                           "message); leave it unset for the embedded Redis broker, or use redis:// or amqp://.")
    if scheme not in ("redis", "rediss", "redis+socket", "amqp", "amqps", "pyamqp"):
        raise SettingError(f"{name}={_redact(url)!r}: use redis://, rediss://, redis+socket:///PATH or amqp:// "
                           "(unset: the embedded Redis broker).")
    return url


def _redact(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url
