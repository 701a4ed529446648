"""The conditional unique constraints, on MariaDB and MySQL too.

Django creates a ``UniqueConstraint`` with a ``condition`` only where the database has partial
indexes (PostgreSQL, SQLite) and skips it elsewhere (``models.W036``): on MariaDB and MySQL an
idempotency key, a waiting interrupt's correlation id, a delivery's topic, a reactor's pause and
a subject's live key would go unguarded, and the store counts on the unique key refusing the
second row of two racing writers. Here each gets the same guarantee on those databases: a
virtual column that is 1 where the condition holds and NULL elsewhere, and a unique index on
the constraint's columns and it (rows outside the condition never collide: NULLs are distinct
in a unique index). The index is named as the constraint. Other databases: nothing to do.

Also: coordination keys of kind ``event``, which emits and waits lock on those databases.
"""

from __future__ import annotations

from django.db import migrations, models

#: (table, constraint name, its columns, its condition in SQL), as in the models' Meta.
CONDITIONAL_UNIQUES = (
    (
        "django_reactor_execution",
        "reactor_exec_idempotency_uniq",
        ("reactor", "idempotency_key"),
        "`idempotency_key` IS NOT NULL",
    ),
    (
        "django_reactor_execution",
        "reactor_exec_child_uniq",
        ("parent_id", "parent_step"),
        "`parent_id` IS NOT NULL",
    ),
    (
        "django_reactor_interrupt",
        "reactor_interrupt_corr_uniq",
        ("reactor", "correlation_id"),
        "`correlation_id` IS NOT NULL AND `status` = 'waiting'",
    ),
    (
        "django_reactor_interrupt",
        "reactor_interrupt_token_uniq",
        ("token_hash",),
        "`token_hash` IS NOT NULL",
    ),
    (
        "django_reactor_subjectkey",
        "reactor_subjectkey_live_uniq",
        ("subject",),
        "`erased_at` IS NULL",
    ),
    (
        "django_reactor_message",
        "reactor_message_key_uniq",
        ("execution_id", "idempotency_key"),
        "`idempotency_key` IS NOT NULL",
    ),
    (
        "django_reactor_message",
        "reactor_message_delivery_uniq",
        ("execution_id", "topic"),
        "`kind` = 'delivery'",
    ),
    (
        "django_reactor_pause",
        "reactor_pause_reactor_uniq",
        ("reactor",),
        "`execution_id` IS NULL",
    ),
    (
        "django_reactor_pause",
        "reactor_pause_run_uniq",
        ("execution_id",),
        "`execution_id` IS NOT NULL",
    ),
)


def _flag(name: str) -> str:
    """The virtual column that says whether a row is under constraint ``name``."""
    return f"{name}_on"


def add_uniques(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "mysql":
        return
    for table, name, columns, condition in CONDITIONAL_UNIQUES:
        indexed = ", ".join(f"`{column}`" for column in (*columns, _flag(name)))
        schema_editor.execute(
            f"ALTER TABLE `{table}` "
            f"ADD COLUMN `{_flag(name)}` TINYINT AS (CASE WHEN {condition} THEN 1 END) VIRTUAL, "
            f"ADD UNIQUE INDEX `{name}` ({indexed})"
        )


def drop_uniques(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "mysql":
        return
    for table, name, columns, _condition in CONDITIONAL_UNIQUES:
        # InnoDB dropped the index it made for a foreign key on the first column when the
        # unique index could serve it: one for the key again, or the drop is refused.
        keep = f", ADD INDEX `{name}_fk` (`{columns[0]}`)" if columns[0].endswith("_id") else ""
        schema_editor.execute(
            f"ALTER TABLE `{table}` DROP INDEX `{name}`, DROP COLUMN `{_flag(name)}`{keep}"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("django_reactor", "0032_flow_control"),
    ]

    operations = [
        # Event keys' rows, which emits and waits lock on MariaDB and MySQL.
        migrations.AlterField(
            model_name="coordinationkey",
            name="kind",
            field=models.CharField(
                choices=[("semaphore", "Semaphore"), ("rate", "Rate limit"), ("event", "Event key")],
                max_length=16,
                verbose_name="kind",
            ),
        ),
        # DDL on MariaDB and MySQL commits as it goes: no transaction around it.
        migrations.RunPython(add_uniques, drop_uniques, atomic=False, elidable=False),
    ]
