"""G4's permission to replay a generated sample trace becomes a value of the signed plan.

Before, `sample_trace: allowed` sat in a plan version's document but was not part of the plan's hash, so
neither signature covered it. Now it is hashed like every threshold. A version that a party has already
approved (or that is signed or superseded) was approved without it: the permission is taken out of that
version's document, which restores exactly what was signed (its hash still matches both signatures), and
the audit log says so; to allow the sample again, amend the plan and both sign it. A draft nobody has
approved keeps the permission, written as `true`, and it is signed with the plan.

The freeze guards of 0005 are lifted for this one statement and put back at once.
"""
import importlib

from django.db import migrations

guards = importlib.import_module("gates.migrations.0005_plan_freeze_guards")

TRACE_GATE = 4


def _allows(item) -> bool:
    value = item.get("sample_trace")
    return value is True or (isinstance(value, str) and value.strip().lower() == "allowed")


def forward(apps, schema_editor):
    PlanVersion = apps.get_model("gates", "PlanVersion")
    SignOff = apps.get_model("gates", "SignOff")
    AuditEvent = apps.get_model("gates", "AuditEvent")
    vendor = schema_editor.connection.vendor
    drop = {"sqlite": guards.SQLITE_DROP, "postgresql": guards.POSTGRESQL_DROP}.get(vendor)
    create = {"sqlite": guards.SQLITE, "postgresql": guards.POSTGRESQL}.get(vendor)
    if drop is None:
        raise RuntimeError(f"no freeze guard for the {vendor} database")
    changed = []
    for version in PlanVersion.objects.all().order_by("pk"):
        gates = version.document.get("gates", []) if isinstance(version.document, dict) else []
        if not any("sample_trace" in item for item in gates if isinstance(item, dict)):
            continue
        approved = SignOff.objects.filter(plan_version=version, decision="approve").exists()
        signed = version.state != "draft" or approved
        document = dict(version.document)
        document["gates"] = []
        removed = False
        for item in gates:
            item = dict(item)
            if "sample_trace" in item:
                allowed = _allows(item) and item.get("number") == TRACE_GATE
                del item["sample_trace"]
                if allowed and not signed:
                    item["sample_trace"] = True
                removed = removed or (allowed and signed)
            document["gates"].append(item)
        changed.append((version, document, removed))
    if not changed:
        return
    for statement in drop:
        schema_editor.execute(statement, params=None)
    for version, document, removed in changed:
        PlanVersion.objects.filter(pk=version.pk).update(document=document)
        if removed:
            AuditEvent.objects.create(
                actor=None, actor_label="migration", pilot_id=version.pilot_id, action="plan.sample_trace_unsigned",
                object_type="planversion", object_id=str(version.pk), from_state=version.state, to_state=version.state,
                detail={"detail_key": f"G{TRACE_GATE}", "before": {"sample_trace": True}, "after": {"sample_trace": False},
                        "reason": "the permission to replay a generated sample trace was not part of what was "
                                  "approved; amend the plan and sign it again to allow it"})
    for statement in create:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("gates", "0007_upload_verification")]

    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
