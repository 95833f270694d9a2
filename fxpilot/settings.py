"""fxpilot settings: every value comes from the environment through strict helpers (fxpilot.env).

The embedded default needs no services: SQLite, an embedded Redis broker on a Unix socket, files under ./var
(the folder mode 0700, the database 0600, the evidence 0400: readable by their owner only).
Production (FXPILOT_ENV=production) needs SECRET_KEY and ALLOWED_HOSTS. DEBUG is off unless FXPILOT_DEBUG=1.
"""
from __future__ import annotations

import ipaddress
import os
import secrets
from datetime import timedelta
from pathlib import Path

from fxpilot.env import (
    SettingError,
    check_broker_url,
    database_from_url,
    envbool,
    envchoice,
    envfloat,
    envint,
    envlist,
    envstr,
)
from infra.broker import embedded_url

BASE_DIR = Path(__file__).resolve().parent.parent

FXPILOT_ENV = envchoice("FXPILOT_ENV", "development", ("development", "production", "test"))
PRODUCTION = FXPILOT_ENV == "production"

DATA_DIR = Path(envstr("FXPILOT_DATA_DIR", str(BASE_DIR / "var")))
if not DATA_DIR.is_absolute():
    DATA_DIR = BASE_DIR / DATA_DIR
if not DATA_DIR.exists():
    DATA_DIR.mkdir(parents=True, mode=0o700)  # the database, sessions, keys and evidence: the owner's only
    DATA_DIR.chmod(0o700)
elif not PRODUCTION and DATA_DIR.stat().st_uid == os.getuid() and DATA_DIR.stat().st_mode & 0o077:
    DATA_DIR.chmod(0o700)  # an embedded default an earlier release left open to everyone


def _secret_key() -> str:
    key = envstr("SECRET_KEY")
    if key:
        if len(key) < 32:
            raise SettingError("SECRET_KEY is shorter than 32 characters; generate a long random value.")
        return key
    if PRODUCTION:
        raise SettingError("SECRET_KEY is required when FXPILOT_ENV=production.")
    # The embedded default generates one secret once and keeps it, so encrypted fields stay readable.
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
# Off unless asked (FXPILOT_DEBUG=1; DEBUG=1 is read too): a technical error page lists the URLs and settings.
DEBUG = envbool("FXPILOT_DEBUG", envbool("DEBUG", False))
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "[::1]", "testserver"])
if PRODUCTION and not ALLOWED_HOSTS:
    raise SettingError("ALLOWED_HOSTS is required when FXPILOT_ENV=production (comma-separated host names).")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "axes",
    "gates",
    "runners",
    "reports",
    "portal",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "portal.middleware.ContentSecurityPolicyMiddleware",
    "portal.middleware.RequestSizeLimitMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "portal.middleware.PersonLanguageMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "fxpilot.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = "fxpilot.wsgi.application"
ASGI_APPLICATION = "fxpilot.asgi.application"

DATABASES = {"default": database_from_url("DATABASE_URL", envstr("DATABASE_URL", f"sqlite:///{DATA_DIR / 'fxpilot.sqlite3'}"), BASE_DIR)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = envstr("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
# gunicorn serves the static files itself (WhiteNoise) with DEBUG off too; outside production also straight from
# STATICFILES_DIRS, so that the embedded default needs no collectstatic.
WHITENOISE_USE_FINDERS = not PRODUCTION

# Evidence (artifacts and reports): files under DATA_DIR by default; with FXPILOT_S3_BUCKET set, objects in an
# S3-compatible store, so that site workers share nothing with the web tier but the database and the broker.
FXPILOT_S3_BUCKET = envstr("FXPILOT_S3_BUCKET")
if FXPILOT_S3_BUCKET:
    _evidence = {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {
        "bucket_name": FXPILOT_S3_BUCKET,
        "endpoint_url": envstr("FXPILOT_S3_ENDPOINT_URL"),
        "region_name": envstr("FXPILOT_S3_REGION", "us-east-1"),
        "access_key": envstr("FXPILOT_S3_ACCESS_KEY_ID", required=True),
        "secret_key": envstr("FXPILOT_S3_SECRET_ACCESS_KEY", required=True),
        "location": envstr("FXPILOT_S3_PREFIX", ""),
        "default_acl": None, "querystring_auth": True, "file_overwrite": True, "max_memory_size": 8 * 1024 * 1024,
        # The store checks each upload against the SHA-256 the client sends with it.
        "object_parameters": {"ChecksumAlgorithm": "SHA256"},
    }}
else:
    _evidence = {"BACKEND": "django.core.files.storage.FileSystemStorage",
                 "OPTIONS": {"location": str(DATA_DIR), "file_permissions_mode": 0o400,
                             "directory_permissions_mode": 0o700}}
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "evidence": _evidence,
}

# Uploads: small by default; artifacts never travel through the web tier.
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("FXPILOT_UPLOAD_MAX_BYTES", 25 * 1024 * 1024, minimum=1024)
FILE_UPLOAD_MAX_MEMORY_SIZE = DATA_UPLOAD_MAX_MEMORY_SIZE

# ── Cache, sessions and signing in ──────────────────────────────────────────────────────────
# Every web process must see the same sessions, or a logout ends the session in one process only.
# With a Redis cache (FXPILOT_CACHE_URL, or by default the broker's Redis) sessions are read from it
# before the database; without one they live in the database alone, and the cache is per process and
# holds nothing that must be shared (drawn charts).
_broker_for_cache = envstr("CELERY_BROKER_URL", "") or ""
FXPILOT_CACHE_URL = envstr(
    "FXPILOT_CACHE_URL", _broker_for_cache if _broker_for_cache.startswith(("redis://", "rediss://")) else ""
)
if FXPILOT_CACHE_URL and not FXPILOT_CACHE_URL.startswith(("redis://", "rediss://", "unix://")):
    raise SettingError(f"FXPILOT_CACHE_URL must be a redis://, rediss:// or unix:// URL, not {FXPILOT_CACHE_URL.split(':')[0]}://…")
if FXPILOT_CACHE_URL:
    CACHES = {
        "default": {
            "BACKEND": "fxpilot.cache.PrefixedRedisCache",
            "LOCATION": FXPILOT_CACHE_URL,
            "KEY_PREFIX": envstr("FXPILOT_CACHE_PREFIX", "fxpilot"),
            "TIMEOUT": 3600,
        }
    }
    SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "fxpilot"}}
    SESSION_ENGINE = "django.contrib.sessions.backends.db"
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", PRODUCTION)
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", PRODUCTION)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = envint("SESSION_COOKIE_AGE", 12 * 3600, minimum=300)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# A refused CSRF check answers JSON under /api/ and Django's page elsewhere.
CSRF_FAILURE_VIEW = "portal.middleware.csrf_failure"
if PRODUCTION:
    # Behind a TLS reverse proxy that sets X-Forwarded-Proto (docs/operations.md).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 365 * 24 * 3600, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)

# Login throttling (django-axes, attempts kept in the database: shared by every process, kept across
# restarts, and never cleared by a successful login; portal.signin): 5 failures for one user name from one
# client address lock that name there, 100 from one address lock the address (but for names that signed in
# from it within 30 days), for 15 minutes, the right password included. The client's address is the one a
# reverse proxy listed in FXPILOT_TRUSTED_PROXIES reports in X-Forwarded-For (its right-most untrusted hop);
# without one, the connection's own.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
FXPILOT_LOGIN_FAILURES_PER_NAME = envint("FXPILOT_LOGIN_FAILURES_PER_NAME", 5, minimum=1)
FXPILOT_LOGIN_FAILURES_PER_ADDRESS = envint("FXPILOT_LOGIN_FAILURES_PER_ADDRESS", 100, minimum=1)
FXPILOT_LOGIN_LOCKOUT_MINUTES = envint("FXPILOT_LOGIN_LOCKOUT_MINUTES", 15, minimum=1)
# An account across addresses (issue 49): past this many failures for one name from anywhere within the lockout
# window, each further attempt for that name waits a delay that doubles with every failure (1 s, 2 s, 4 s, …, at most
# FXPILOT_LOGIN_ACCOUNT_MAX_DELAY seconds) after the last one, the right password included: guessing from many
# addresses slows to one try per delay, and the person gets in once the delay has passed (no lock for ever).
FXPILOT_LOGIN_FAILURES_PER_ACCOUNT = envint("FXPILOT_LOGIN_FAILURES_PER_ACCOUNT", 10, minimum=1)
FXPILOT_LOGIN_ACCOUNT_MAX_DELAY = envint("FXPILOT_LOGIN_ACCOUNT_MAX_DELAY", 900, minimum=1)
# Password-reset mails: at most this many to one address, and this many reset requests from one client address, an
# hour (portal.views.account); past either, the same answer and no mail.
FXPILOT_RESET_MAILS_PER_ADDRESS = envint("FXPILOT_RESET_MAILS_PER_ADDRESS", 3, minimum=1)
FXPILOT_RESET_REQUESTS_PER_CLIENT = envint("FXPILOT_RESET_REQUESTS_PER_CLIENT", 20, minimum=1)
FXPILOT_LOGIN_KNOWN_DAYS = envint("FXPILOT_LOGIN_KNOWN_DAYS", 30, minimum=0)
FXPILOT_TRUSTED_PROXIES = envlist("FXPILOT_TRUSTED_PROXIES", [])
for _proxy in FXPILOT_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError:
        raise SettingError(f"FXPILOT_TRUSTED_PROXIES: {_proxy!r} is not an IP address or network (e.g. 127.0.0.1, "
                           "10.0.0.0/8).") from None
AXES_HANDLER = "portal.signin.LoginThrottleHandler"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_CLIENT_IP_CALLABLE = "portal.signin.client_address"
AXES_FAILURE_LIMIT = FXPILOT_LOGIN_FAILURES_PER_NAME
AXES_COOLOFF_TIME = timedelta(minutes=FXPILOT_LOGIN_LOCKOUT_MINUTES)
AXES_RESET_ON_SUCCESS = False
AXES_LOCKOUT_CALLABLE = "portal.signin.lockout_response"
AXES_USERNAME_CALLABLE = "portal.signin.attempted_username"
# Password reset links (Django's tokens) are good for this long; API tokens live this many days unless their
# maker chooses otherwise (1–365).
PASSWORD_RESET_TIMEOUT = envint("PASSWORD_RESET_TIMEOUT", 3600, minimum=300)
FXPILOT_API_TOKEN_DAYS = envint("FXPILOT_API_TOKEN_DAYS", 90, minimum=1, maximum=365)
AXES_VERBOSE = False

# Mail: files under var/mail by default, SMTP when EMAIL_HOST is set.
EMAIL_HOST = envstr("EMAIL_HOST")
if EMAIL_HOST:
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_PORT = envint("EMAIL_PORT", 587, minimum=1, maximum=65535)
    EMAIL_HOST_USER = envstr("EMAIL_HOST_USER", "")
    EMAIL_HOST_PASSWORD = envstr("EMAIL_HOST_PASSWORD", "")
    EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", True)
else:
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    EMAIL_FILE_PATH = DATA_DIR / "mail"
DEFAULT_FROM_EMAIL = envstr("DEFAULT_FROM_EMAIL", "fxpilot <fxpilot@localhost>")
SITE_URL = envstr("SITE_URL", "http://127.0.0.1:8000")

# Celery: the database is the source of truth; the broker only carries "look at step N".
# Without CELERY_BROKER_URL: the embedded Redis server on a Unix socket under the data folder
# (infra.broker), started by whichever process of the embedded default needs it first.
FXPILOT_EMBEDDED_BROKER = not envstr("CELERY_BROKER_URL")
CELERY_BROKER_URL = check_broker_url("CELERY_BROKER_URL", envstr("CELERY_BROKER_URL", embedded_url(DATA_DIR)))
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # A message a worker took but never acknowledged (the worker was killed) goes back to its
    # queue after this long; it must exceed the longest task plus the longest countdown.
    "visibility_timeout": envint("CELERY_VISIBILITY_TIMEOUT", 3600, minimum=60),
    # Fail fast and retry on a broken broker connection rather than hang on it.
    "socket_timeout": 30, "socket_connect_timeout": 5, "retry_on_timeout": True, "health_check_interval": 25,
}
if FXPILOT_EMBEDDED_BROKER:
    CELERY_BROKER_TRANSPORT_OPTIONS["fxpilot_embedded_data_dir"] = str(DATA_DIR)
# Reconnect for ever (a broker restart is an outage, not a reason for a worker to exit); a
# publisher retries for about 10 s before the dispatch is left to the reconcile sweep.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 20, "interval_start": 0.1, "interval_step": 0.5, "interval_max": 1.0}
# SIGTERM: running tasks get this long to finish, then the worker stops them (they are resumed
# by the reconcile sweep; their messages return to the queue).
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = envfloat("CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT", 5.0, minimum=0.0)
CELERY_WORKER_ENABLE_SOFT_SHUTDOWN_ON_IDLE = False
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = envint("CELERY_TASK_SOFT_TIME_LIMIT", 300, minimum=10)
CELERY_TASK_TIME_LIMIT = envint("CELERY_TASK_TIME_LIMIT", 360, minimum=15)
CELERY_TASK_DEFAULT_QUEUE = "fxpilot"
# Checking an uploaded PDF (seconds and hundreds of MB each) has a queue of its own, served by the control worker
# with at most FXPILOT_CHECKS_AT_ONCE running at once, so that checks cannot hold every slot gate runs need;
# each person may ask for FXPILOT_CHECKS_PER_HOUR of them an hour (the portal answers 429 beyond).
FXPILOT_CHECK_QUEUE = envstr("FXPILOT_CHECK_QUEUE", "fxpilot-checks")
FXPILOT_CHECKS_AT_ONCE = envint("FXPILOT_CHECKS_AT_ONCE", 1, minimum=1)
FXPILOT_CHECKS_PER_HOUR = envint("FXPILOT_CHECKS_PER_HOUR", 10, minimum=1)
CELERY_TASK_ROUTES = {"gates.tasks.verify_upload": {"queue": FXPILOT_CHECK_QUEUE}}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
FXPILOT_RECONCILE_SECONDS = envfloat("FXPILOT_RECONCILE_SECONDS", 15.0, minimum=1.0)
# Gate runs (runners.orchestration): how often a detached step is polled, when a step's heartbeat
# is stale (its worker died), and how often a step may be claimed before it errors.
FXPILOT_POLL_SECONDS = envfloat("FXPILOT_POLL_SECONDS", 5.0, minimum=0.05)
FXPILOT_STALE_SECONDS = envfloat("FXPILOT_STALE_SECONDS", 90.0, minimum=1.0)
FXPILOT_STEP_MAX_ATTEMPTS = envint("FXPILOT_STEP_MAX_ATTEMPTS", 4, minimum=1)
# A node that stops answering while a detached step runs: looked at again at most this far apart, for as long
# as the step's deadline (its start + this, unless its kind says more) allows (docs/operations.md).
FXPILOT_REATTACH_MAX_SECONDS = envfloat("FXPILOT_REATTACH_MAX_SECONDS", 10.0, minimum=0.05)
FXPILOT_STEP_DEADLINE_SECONDS = envfloat("FXPILOT_STEP_DEADLINE_SECONDS", 6 * 3600.0, minimum=1.0)
# Site agents (runners.agentlink): a call no agent took within PICKUP seconds is given up as "unreachable"; a taken
# call the agent has not spoken of for SILENCE seconds as "connection lost"; a file an agent uploads is refused
# above MAX_FILE bytes.
FXPILOT_AGENT_PICKUP_SECONDS = envfloat("FXPILOT_AGENT_PICKUP_SECONDS", 30.0, minimum=0.05)
FXPILOT_AGENT_SILENCE_SECONDS = envfloat("FXPILOT_AGENT_SILENCE_SECONDS", 30.0, minimum=0.05)
FXPILOT_AGENT_MAX_FILE = envint("FXPILOT_AGENT_MAX_FILE", 4 * 1024**3, minimum=1024)

# Evidence signing (see docs/reports.md); the embedded default uses `manage.py signing_setup`.
FXPILOT_SIGNING_KEY = envstr("FXPILOT_SIGNING_KEY", str(DATA_DIR / "signing" / "signer-key.pem"))
FXPILOT_SIGNING_CERT = envstr("FXPILOT_SIGNING_CERT", str(DATA_DIR / "signing" / "signer-cert.pem"))
FXPILOT_SIGNING_ROOT = envstr("FXPILOT_SIGNING_ROOT", str(DATA_DIR / "signing" / "root-cert.pem"))
FXPILOT_SIGNING_KEY_PASSPHRASE = envstr("FXPILOT_SIGNING_KEY_PASSPHRASE")
FXPILOT_TSA_URL = envstr("FXPILOT_TSA_URL")

# Time scale of the simulated nodes (1.0 = real time); the demo and tests run faster.
FXPILOT_SIM_TIME_SCALE = envfloat("FXPILOT_SIM_TIME_SCALE", 0.01, minimum=0.0001)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": envchoice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))},
    "loggers": {"paramiko": {"level": "WARNING"}, "axes": {"level": "WARNING"}},
}

if FXPILOT_ENV == "test":
    # Fast hashing for the test suite only.
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
