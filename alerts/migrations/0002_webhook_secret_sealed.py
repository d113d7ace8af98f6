from django.db import migrations, models

from core.sealed import seal


def secrets_seal(apps, schema_editor):
    Webhook = apps.get_model("alerts", "Webhook")
    for hook in Webhook.objects.all():
        hook.secret_sealed = seal(hook.secret)
        hook.save(update_fields=["secret_sealed"])


class Migration(migrations.Migration):
    """A webhook's signing secret is kept sealed under a key derived from SECRET_KEY
    (``core.sealed``), not in clear: each existing secret is sealed, then the clear column
    goes."""

    dependencies = [("alerts", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="webhook",
            name="secret_sealed",
            field=models.TextField(default=""),
            preserve_default=False,
        ),
        migrations.RunPython(secrets_seal, migrations.RunPython.noop),
        migrations.RemoveField(model_name="webhook", name="secret"),
    ]
