"""The embedded default (issue 27, item 5): DEBUG off unless asked, static files still served, and its data folder,
database and evidence readable by their owner only."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

from django.test import Client

from tests.security.test_production_defaults import ROOT, _settings


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_debug_is_off_unless_asked(tmp_path):
    assert _settings(tmp_path / "a")["DEBUG"] == "False"
    assert _settings(tmp_path / "b", FXPILOT_DEBUG="1")["DEBUG"] == "True"


def test_a_missing_page_lists_no_urls_and_static_files_are_still_served(db):
    client = Client()
    missing = client.get("/no-such-page/")
    assert missing.status_code == 404 and "URLconf" not in missing.content.decode()
    css = client.get("/static/fxpilot/portal.css")
    assert css.status_code == 200 and b"".join(css.streaming_content if css.streaming else [css.content])


def test_the_database_folder_and_evidence_are_the_owners_only(tmp_path):
    data = tmp_path / "fresh" / "var"
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY", "DEBUG")}
    environ.update({"FXPILOT_DATA_DIR": str(data), "FXPILOT_ENV": "development"})
    os.umask(old := os.umask(0o022))  # a usual umask: the modes must not depend on it
    script = ("from django.core.management import call_command; call_command('migrate', verbosity=0); "
              "from django.core.files.base import ContentFile; from django.core.files.storage import storages; "
              "print(storages['evidence'].save('artifacts/ab/x', ContentFile(b'evidence')))")
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, env=environ,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert _mode(data) == 0o700
    assert _mode(data / "fxpilot.sqlite3") == 0o600
    for extra in ("fxpilot.sqlite3-wal", "fxpilot.sqlite3-shm"):
        if (data / extra).exists():
            assert _mode(data / extra) & 0o077 == 0, extra
    assert _mode(data / "artifacts" / "ab" / "x") == 0o400 and _mode(data / "artifacts") == 0o700
    assert _mode(data / "secret_key") == 0o600
    # a database an earlier release left readable by everyone is closed again at the next start
    os.chmod(data / "fxpilot.sqlite3", 0o644)
    os.chmod(data, 0o755)
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", "from django.db import connection; "
                             "connection.ensure_connection()"], cwd=ROOT, env=environ, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    assert _mode(data / "fxpilot.sqlite3") == 0o600 and _mode(data) == 0o700
    assert old is not None
