from django.conf import settings
from django.db import migrations


def group_create(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Group.objects.get_or_create(name=getattr(settings, "GPUMARKET_AUDITOR_GROUP", "auditor"))


class Migration(migrations.Migration):
    """The auditor role's group: its members read everything and change nothing."""

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("governance", "0001_initial"),
    ]

    operations = [migrations.RunPython(group_create, migrations.RunPython.noop)]
