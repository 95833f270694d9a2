"""Django's SQLite backend with one change: emptying the tables (`manage.py flush`, the test suite between
transactional tests) holds a row in `fxpilot_flush_permit` while it deletes, so the triggers that refuse deleting a
signed plan version or its criteria (gates migration 0013) let the whole database be emptied, and nothing else.
PostgreSQL needs no such thing: its flush is TRUNCATE, which fires no DELETE trigger."""
import os
from pathlib import Path

from django.db.backends.sqlite3 import base, operations

PERMIT = "fxpilot_flush_permit"


class DatabaseOperations(operations.DatabaseOperations):
    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        statements = super().sql_flush(style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        if not statements:
            return statements
        return [f"CREATE TABLE IF NOT EXISTS {PERMIT} (flushing INTEGER NOT NULL);",
                f"INSERT INTO {PERMIT} (flushing) VALUES (1);", *statements, f"DELETE FROM {PERMIT};"]


class DatabaseWrapper(base.DatabaseWrapper):
    """…and the database file is its owner's only (0600: it holds the sessions and the encrypted keys): made so
    before SQLite first opens it, and an existing one left readable by others is closed again. SQLite gives the
    -wal and -shm files the database's mode."""

    ops_class = DatabaseOperations

    def get_new_connection(self, conn_params):
        name = str(conn_params.get("database", ""))
        if name and name != ":memory:" and not name.startswith("file:"):
            private_file(Path(name))
        return super().get_new_connection(conn_params)


def private_file(path: Path) -> None:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        info = path.stat()
        if info.st_uid == os.getuid() and info.st_mode & 0o077:
            path.chmod(0o600)
    except FileNotFoundError:
        return  # no folder: SQLite says so itself
    else:
        os.close(fd)
