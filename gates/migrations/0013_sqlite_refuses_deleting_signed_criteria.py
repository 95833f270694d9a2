"""SQLite refuses deleting a signed plan version or its criteria too, as PostgreSQL does since 0005.

0005 left SQLite without it because Django empties SQLite tables with DELETE (`manage.py flush`, the test suite
between transactional tests). Now the embedded default's database engine, `fxpilot.sqlite3` (Django's SQLite with
one change), opens a permit in `fxpilot_flush_permit` for the duration of a flush; the triggers refuse every other
DELETE of a frozen version (signed or superseded) or of its criteria: a raw DELETE, a queryset in a data
migration, a cascade from its pilot. (Whoever may write the permit table may also drop a trigger: the guard is
against mistakes and code, like PostgreSQL's; the plan's hash at evaluation is the last line.)
"""
from django.db import migrations

MESSAGE_CRITERION = "fxpilot: refused: the criteria of a signed plan version are frozen; amend the plan instead"
MESSAGE_VERSION = "fxpilot: refused: a signed plan version is frozen; amend the plan instead"
NOT_FLUSHING = "NOT EXISTS (SELECT 1 FROM fxpilot_flush_permit)"

SQLITE = [
    "CREATE TABLE IF NOT EXISTS fxpilot_flush_permit (flushing INTEGER NOT NULL)",
    f"""CREATE TRIGGER fxpilot_criterion_frozen_delete BEFORE DELETE ON gates_criterion
    WHEN (SELECT state FROM gates_planversion WHERE id = OLD.plan_version_id) IN ('signed', 'superseded')
      AND {NOT_FLUSHING}
    BEGIN SELECT RAISE(ABORT, '{MESSAGE_CRITERION}'); END""",
    f"""CREATE TRIGGER fxpilot_planversion_frozen_delete BEFORE DELETE ON gates_planversion
    WHEN OLD.state IN ('signed', 'superseded') AND {NOT_FLUSHING}
    BEGIN SELECT RAISE(ABORT, '{MESSAGE_VERSION}'); END""",
]
SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS fxpilot_criterion_frozen_delete",
    "DROP TRIGGER IF EXISTS fxpilot_planversion_frozen_delete",
    "DROP TABLE IF EXISTS fxpilot_flush_permit",
]


def _run(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "sqlite":
            return  # PostgreSQL refuses these deletions since 0005_plan_freeze_guards
        for statement in statements:
            schema_editor.execute(statement, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [("gates", "0012_api_token_expiry")]

    operations = [migrations.RunPython(_run(SQLITE), _run(SQLITE_DROP))]
