"""The audit log's actions are an enumeration (gates.models.AuditAction): its choices only, no schema change."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('gates', '0009_traces_in_the_evidence_store'),
    ]

    operations = [
        migrations.AlterField(
            model_name='auditevent',
            name='action',
            field=models.CharField(choices=[('pilot.created', 'pilot created'), ('pilot.activated', 'pilot activated'), ('pilot.completed', 'pilot completed'), ('pilot.halted', 'pilot halted'), ('pilot.sizing_set', 'capacity sizing settings set'), ('plan.version_created', 'plan version created'), ('plan.approve', 'plan approved'), ('plan.reject', 'plan rejected'), ('plan.signed', 'plan signed by both parties'), ('plan.superseded', 'plan superseded'), ('plan.sample_trace', "G4's permission to replay a generated sample trace changed"), ('plan.sample_trace_unsigned', 'generated sample trace no longer allowed for G4: it was not part of what was signed'), ('criterion.edited', 'criterion changed'), ('gate.opened', 'gate opened'), ('gate.verdict', 'verdict recorded'), ('gate.approve', 'gate approved'), ('gate.reject', 'gate rejected'), ('gate.signed_off', 'gate signed off'), ('gate.extended', 'gate under review opened again for a run with more repetitions'), ('gate.reopened', 'gate reopened'), ('run.started', 'run started'), ('run.finished', 'run finished'), ('run.cancel_requested', 'run cancel requested'), ('report.created', 'report made and signed'), ('report.countersigned', 'report countersigned'), ('trace.uploaded', 'customer trace uploaded'), ('site.created', 'site added'), ('node.created', 'node registered'), ('node.host_key_accepted', 'host key accepted'), ('credential.created', 'SSH key uploaded')], max_length=64),
        ),
    ]
