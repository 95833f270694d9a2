"""Django's SQLite backend with one change: emptying the tables (`manage.py flush`, the test suite between
transactional tests) holds a row in `fxpilot_flush_permit` while it deletes, so the triggers that refuse deleting a
signed plan version or its criteria (gates migration 0013) let the whole database be emptied, and nothing else.
PostgreSQL needs no such thing: its flush is TRUNCATE, which fires no DELETE trigger."""
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
    ops_class = DatabaseOperations
