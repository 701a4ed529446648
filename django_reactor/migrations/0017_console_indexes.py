"""Indexes for the admin's operations console (issue 18): the overview reads the runs that
ended in a time window by status, the coordination panel the locks held now and the halted
ordered locks, each without reading a whole table."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_reactor", "0016_event_kind_launch")]

    operations = [
        migrations.AddIndex(
            model_name="execution",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)),
                fields=["finished_at", "status"],
                name="reactor_exec_finished_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="coordinationlock",
            index=models.Index(
                condition=models.Q(("owner__isnull", False)),
                fields=["key"],
                name="reactor_coord_lock_held_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="orderedlockstate",
            index=models.Index(
                condition=models.Q(("halted_after__isnull", False)),
                fields=["key"],
                name="reactor_ordered_halted_idx",
            ),
        ),
    ]
