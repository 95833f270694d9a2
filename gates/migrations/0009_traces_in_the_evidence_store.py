"""Uploaded G4 traces live in the evidence store, like artifacts and reports.

They were files under DATA_DIR/traces/ of the web tier. With the embedded file-system store (rooted at
DATA_DIR) their names are already right; with an object store, each file still under DATA_DIR is sent to
the store under the same name, checked against the SHA-256 taken at upload (a file that no longer matches
is left where it is, and reading it later refuses it, saying so).
"""
import hashlib
from pathlib import Path

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.db import migrations, models


def forward(apps, schema_editor):
    CustomerTrace = apps.get_model("gates", "CustomerTrace")
    storage = storages["evidence"]
    for trace in CustomerTrace.objects.all().only("path", "sha256"):
        try:
            if storage.exists(trace.path):
                continue
        except OSError:
            continue
        local = Path(settings.DATA_DIR) / trace.path
        if not local.is_file():
            continue
        data = local.read_bytes()
        if hashlib.sha256(data).hexdigest() != trace.sha256:
            continue
        stored = storage.save(trace.path, ContentFile(data, name=trace.path))
        if stored != trace.path:
            storage.delete(stored)


class Migration(migrations.Migration):

    dependencies = [
        ('gates', '0008_sample_trace_is_signed'),
    ]

    operations = [
        migrations.AlterField(
            model_name='customertrace',
            name='path',
            field=models.CharField(help_text='Its name in the evidence store (settings.STORAGES["evidence"])', max_length=500),
        ),
        migrations.AlterField(
            model_name='report',
            name='path',
            field=models.CharField(help_text='Its name in the evidence store (settings.STORAGES["evidence"])', max_length=500),
        ),
        migrations.RunPython(forward, migrations.RunPython.noop),
    ]
