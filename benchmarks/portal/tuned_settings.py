"""fxpilot's settings plus two production tunings the portal benchmark can compare (--tuned):
persistent database connections and sessions read from the cache before the database."""
from fxpilot.settings import *  # noqa: F403

DATABASES["default"]["CONN_MAX_AGE"] = 600  # noqa: F405
SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
