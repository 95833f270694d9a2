"""API tokens expire (issue 27, item 4), and are revoked with the moment it happened.

Tokens issued before this migration had no expiry: each keeps working for API_TOKEN_DAYS (90) days from the
moment the migration runs (not from its creation, so nobody's script stops on the day of the upgrade), then the
API refuses it with 401 "expired" and its owner makes a new one (docs/operations.md, "API tokens").
"""
from datetime import timedelta

import django.utils.timezone
from django.db import migrations, models

import gates.models

DAYS_FOR_EXISTING_TOKENS = 90


def give_existing_tokens_an_expiry(apps, schema_editor):
    ApiToken = apps.get_model("gates", "ApiToken")
    ApiToken.objects.filter(expires__isnull=True).update(
        expires=django.utils.timezone.now() + timedelta(days=DAYS_FOR_EXISTING_TOKENS))


class Migration(migrations.Migration):
    dependencies = [("gates", "0011_trace_analysis_in_the_background")]

    operations = [
        migrations.AddField(model_name="apitoken", name="expires", field=models.DateTimeField(null=True)),
        migrations.RunPython(give_existing_tokens_an_expiry, migrations.RunPython.noop),
        migrations.AlterField(model_name="apitoken", name="expires",
                              field=models.DateTimeField(default=gates.models.default_token_expiry)),
        migrations.AddField(model_name="apitoken", name="revoked_at",
                            field=models.DateTimeField(blank=True, editable=False, null=True)),
    ]
