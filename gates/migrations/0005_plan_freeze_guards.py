"""The database refuses changes to a signed plan version and its criteria, whoever sends the SQL.

The models refuse first (gates.models.PlanFrozenError); these triggers also stop a queryset in a data
migration, a raw UPDATE and the admin's bulk actions. A frozen version (signed or superseded) may only
move from signed to superseded. PostgreSQL also refuses deleting a frozen version or its criteria;
SQLite does not (Django empties SQLite tables with DELETE, which such a trigger would block), and there a
deleted criterion is caught when the plan is next judged, by its hash.
"""
from django.db import migrations

MESSAGE_CRITERION = "fxpilot: refused: the criteria of a signed plan version are frozen; amend the plan instead"
MESSAGE_VERSION = "fxpilot: refused: a signed plan version is frozen; amend the plan instead"

SQLITE = [
    f"""CREATE TRIGGER fxpilot_criterion_frozen_insert BEFORE INSERT ON gates_criterion
    WHEN (SELECT state FROM gates_planversion WHERE id = NEW.plan_version_id) IN ('signed', 'superseded')
    BEGIN SELECT RAISE(ABORT, '{MESSAGE_CRITERION}'); END""",
    f"""CREATE TRIGGER fxpilot_criterion_frozen_update BEFORE UPDATE ON gates_criterion
    WHEN (SELECT state FROM gates_planversion WHERE id = OLD.plan_version_id) IN ('signed', 'superseded')
      OR (SELECT state FROM gates_planversion WHERE id = NEW.plan_version_id) IN ('signed', 'superseded')
    BEGIN SELECT RAISE(ABORT, '{MESSAGE_CRITERION}'); END""",
    f"""CREATE TRIGGER fxpilot_planversion_frozen_update BEFORE UPDATE ON gates_planversion
    WHEN OLD.state IN ('signed', 'superseded') AND NOT (
        NEW.pilot_id IS OLD.pilot_id AND NEW.number IS OLD.number AND NEW.source IS OLD.source
        AND NEW.document IS OLD.document AND NEW.sha256 IS OLD.sha256 AND NEW.signed_at IS OLD.signed_at
        AND (NEW.state IS OLD.state OR (OLD.state = 'signed' AND NEW.state = 'superseded')))
    BEGIN SELECT RAISE(ABORT, '{MESSAGE_VERSION}'); END""",
]
SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS fxpilot_criterion_frozen_insert",
    "DROP TRIGGER IF EXISTS fxpilot_criterion_frozen_update",
    "DROP TRIGGER IF EXISTS fxpilot_planversion_frozen_update",
]

POSTGRESQL = [
    f"""CREATE OR REPLACE FUNCTION fxpilot_criterion_frozen() RETURNS trigger AS $$
    BEGIN
      IF (TG_OP IN ('UPDATE', 'DELETE') AND EXISTS (SELECT 1 FROM gates_planversion
            WHERE id = OLD.plan_version_id AND state IN ('signed', 'superseded')))
         OR (TG_OP IN ('INSERT', 'UPDATE') AND EXISTS (SELECT 1 FROM gates_planversion
            WHERE id = NEW.plan_version_id AND state IN ('signed', 'superseded'))) THEN
        RAISE EXCEPTION '{MESSAGE_CRITERION}' USING ERRCODE = 'integrity_constraint_violation';
      END IF;
      IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
      RETURN NEW;
    END $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER fxpilot_criterion_frozen BEFORE INSERT OR UPDATE OR DELETE ON gates_criterion
    FOR EACH ROW EXECUTE FUNCTION fxpilot_criterion_frozen()""",
    f"""CREATE OR REPLACE FUNCTION fxpilot_planversion_frozen() RETURNS trigger AS $$
    BEGIN
      IF OLD.state IN ('signed', 'superseded') THEN
        IF TG_OP = 'DELETE' OR NEW.pilot_id IS DISTINCT FROM OLD.pilot_id OR NEW.number IS DISTINCT FROM OLD.number
           OR NEW.source IS DISTINCT FROM OLD.source OR NEW.document::jsonb IS DISTINCT FROM OLD.document::jsonb
           OR NEW.sha256 IS DISTINCT FROM OLD.sha256 OR NEW.signed_at IS DISTINCT FROM OLD.signed_at
           OR NOT (NEW.state = OLD.state OR (OLD.state = 'signed' AND NEW.state = 'superseded')) THEN
          RAISE EXCEPTION '{MESSAGE_VERSION}' USING ERRCODE = 'integrity_constraint_violation';
        END IF;
      END IF;
      IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
      RETURN NEW;
    END $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER fxpilot_planversion_frozen BEFORE UPDATE OR DELETE ON gates_planversion
    FOR EACH ROW EXECUTE FUNCTION fxpilot_planversion_frozen()""",
]
POSTGRESQL_DROP = [
    "DROP TRIGGER IF EXISTS fxpilot_criterion_frozen ON gates_criterion",
    "DROP TRIGGER IF EXISTS fxpilot_planversion_frozen ON gates_planversion",
    "DROP FUNCTION IF EXISTS fxpilot_criterion_frozen()",
    "DROP FUNCTION IF EXISTS fxpilot_planversion_frozen()",
]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        statements = statements_by_vendor.get(schema_editor.connection.vendor)
        if statements is None:
            raise RuntimeError(f"no freeze guard for the {schema_editor.connection.vendor} database")
        for statement in statements:
            schema_editor.execute(statement, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [("gates", "0004_api_token")]

    operations = [
        migrations.RunPython(
            _run({"sqlite": SQLITE, "postgresql": POSTGRESQL}),
            _run({"sqlite": SQLITE_DROP, "postgresql": POSTGRESQL_DROP}),
        ),
    ]
