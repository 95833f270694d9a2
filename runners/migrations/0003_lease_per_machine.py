import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    """A lease is keyed by the machine (address, host key), not by the Node row: two pilots meet on one machine."""

    dependencies = [
        ('runners', '0002_node_lease_artifact_outcome'),
    ]

    operations = [
        migrations.DeleteModel(name='NodeLease'),
        migrations.CreateModel(
            name='NodeLease',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('resource', models.CharField(help_text='address or host key of the machine', max_length=400, unique=True)),
                ('taken', models.DateTimeField(default=django.utils.timezone.now)),
                ('job', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='leases', to='runners.job')),
                ('node', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='leases', to='runners.node')),
            ],
        ),
    ]
