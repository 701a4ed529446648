"""The database's identity: a table of one row, whose random id task messages carry so that a
worker on another database refuses them (``django_reactor.store.identity``).

The model is unmanaged, so that ``flush`` leaves the row; the table is created here with the
schema editor (portable across databases) and its row written at once.
"""

import uuid

import django.utils.timezone
from django.db import migrations, models


def fields():
    return [
        ("id", models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
        (
            "identity",
            models.UUIDField(
                default=uuid.uuid4, editable=False, unique=True, verbose_name="identity"
            ),
        ),
        (
            "created_at",
            models.DateTimeField(
                default=django.utils.timezone.now, editable=False, verbose_name="created at"
            ),
        ),
    ]


OPTIONS = {
    "verbose_name": "database identity",
    "verbose_name_plural": "database identity",
    "db_table": "django_reactor_database",
}


def draw_identity(apps, schema_editor):
    DatabaseIdentity = apps.get_model("django_reactor", "DatabaseIdentity")
    DatabaseIdentity.objects.using(schema_editor.connection.alias).create(
        id=1, identity=uuid.uuid4(), created_at=django.utils.timezone.now()
    )


class Migration(migrations.Migration):
    dependencies = [
        ("django_reactor", "0022_reconnect_event"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="DatabaseIdentity",
                    fields=fields(),
                    options={**OPTIONS, "managed": False},
                ),
            ],
            database_operations=[
                migrations.CreateModel(
                    name="DatabaseIdentity",
                    fields=fields(),
                    options={
                        **OPTIONS,
                        "constraints": [
                            models.CheckConstraint(
                                condition=models.Q(id=1), name="reactor_database_one_row"
                            )
                        ],
                    },
                ),
            ],
        ),
        migrations.RunPython(draw_identity, migrations.RunPython.noop, elidable=False),
    ]
