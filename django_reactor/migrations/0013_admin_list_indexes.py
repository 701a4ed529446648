"""Indexes for the admin's interrupt, dispatch and map lists (issue 15): newest first, filtered by
status, reactor or reason, without reading the whole table."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_reactor", "0012_map_claims")]

    operations = [
        migrations.AddIndex(
            model_name="maprun",
            index=models.Index(fields=["created_at", "id"], name="reactor_map_created_idx"),
        ),
        migrations.AddIndex(
            model_name="dispatch",
            index=models.Index(fields=["reason", "id"], name="reactor_dispatch_reason_idx"),
        ),
        migrations.AddIndex(
            model_name="interrupt",
            index=models.Index(fields=["created_at", "id"], name="reactor_interrupt_created_idx"),
        ),
        migrations.AddIndex(
            model_name="interrupt",
            index=models.Index(
                fields=["status", "created_at", "id"], name="reactor_interrupt_status_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="interrupt",
            index=models.Index(
                fields=["reactor", "created_at", "id"], name="reactor_interrupt_reactor_idx"
            ),
        ),
    ]
