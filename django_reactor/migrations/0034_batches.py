"""Batches (``BatchItem``, the runs' batch key and size), and, on PostgreSQL, the function a
run's insert calls to take its concurrency key's room in the same statement.

``django_reactor_hold_key`` takes the key's advisory lock (the one ``store.flow.lock_key``
takes), then, seeing every run committed before it got the lock (a VOLATILE function's query
takes a new snapshot), raises ``RXK01`` when the key has no room (its ``limit`` of runs in
flight, or runs queued for it): the insert fails and writes nothing, and the start decides
under the lock instead. With room it returns the key, which the insert stores. The statuses
are those of ``store.flow.HOLDING``, written out so the queries match the key's partial index.
"""

import django.db.models.deletion
from django.db import migrations, models

HOLD_KEY = """
CREATE OR REPLACE FUNCTION django_reactor_hold_key(run_reactor text, run_key text, key_limit integer)
RETURNS text LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(
        'django_reactor.flow:concurrency:' || length(run_reactor) || ':' || run_reactor || ':'
        || run_key, 0));
    IF EXISTS (
        SELECT 1 FROM django_reactor_execution
        WHERE reactor = run_reactor AND concurrency_key = run_key AND concurrency_key <> ''
            AND status = 'queued'
    ) OR (
        SELECT count(*) FROM (
            SELECT 1 FROM django_reactor_execution
            WHERE reactor = run_reactor AND concurrency_key = run_key AND concurrency_key <> ''
                AND status IN ('pending', 'scheduled', 'running', 'paused', 'rolling_back',
                               'suspended')
            LIMIT key_limit
        ) AS holding
    ) >= key_limit THEN
        RAISE EXCEPTION 'concurrency key % of % has no room', run_key, run_reactor
            USING ERRCODE = 'RXK01';
    END IF;
    RETURN run_key;
END
$$;
"""


def create_hold_key(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(HOLD_KEY, params=None)


def drop_hold_key(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS django_reactor_hold_key(text, text, integer)")


class Migration(migrations.Migration):
    dependencies = [
        ("django_reactor", "0033_mariadb"),
    ]

    operations = [
        migrations.CreateModel(
            name="BatchItem",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "reactor",
                    models.CharField(
                        help_text="Registered name of the reactor.",
                        max_length=255,
                        verbose_name="reactor",
                    ),
                ),
                (
                    "idempotency_key",
                    models.CharField(max_length=255, verbose_name="idempotency key"),
                ),
                (
                    "inputs_digest",
                    models.CharField(
                        help_text="Fingerprint of the item's inputs, to refuse the key for other inputs.",
                        max_length=64,
                        verbose_name="inputs digest",
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True, verbose_name="created at")),
            ],
            options={
                "verbose_name": "batch item",
                "verbose_name_plural": "batch items",
            },
        ),
        migrations.AddField(
            model_name="execution",
            name="batch_key",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="For a reactor with Meta.batch: the key whose starts this run collects as its items while it waits to start.",
                max_length=255,
                verbose_name="batch key",
            ),
        ),
        migrations.AddField(
            model_name="execution",
            name="batch_size",
            field=models.PositiveIntegerField(
                db_default=0,
                default=0,
                help_text="For a batched run: how many items it holds.",
                verbose_name="batch size",
            ),
        ),
        migrations.AlterField(
            model_name="executionevent",
            name="kind",
            field=models.CharField(
                choices=[
                    ("start", "Run started"),
                    ("run", "Step ran"),
                    ("retry", "Step attempt failed, retrying"),
                    ("fail", "Failed"),
                    ("skip", "Step skipped"),
                    ("halt", "Halted"),
                    ("compensate", "Step compensated"),
                    ("compensate_failed", "Compensation failed"),
                    ("compensate_skipped", "No compensation defined"),
                    ("undo", "Step undone"),
                    ("undo_failed", "Undo failed"),
                    ("undo_skipped", "No undo defined"),
                    ("complete", "Run completed"),
                    ("abort", "Run aborted"),
                    ("hand_back", "Worker interrupted, run handed back"),
                    ("cancel", "Run cancelled"),
                    ("rollback", "Rollback started"),
                    ("rerun", "Run retried as a new execution"),
                    ("handoff", "Handed off to a worker"),
                    ("resume", "Resumed by a worker"),
                    ("attention", "Needs attention"),
                    ("dispatch", "Async unit dispatched"),
                    ("park", "Waiting for an async result"),
                    ("interrupt", "Interrupt reached"),
                    ("pause", "Paused for a payload"),
                    ("payload", "Payload accepted"),
                    ("invalid_payload", "Invalid payload refused"),
                    ("expire", "Interrupt expired"),
                    ("map", "Map elements started"),
                    ("acquire", "Coordination acquired"),
                    ("launch", "Steps started side by side"),
                    ("sleep", "Sleeping until a time"),
                    ("deadline", "Deadline passed"),
                    ("timeout", "Step attempt timed out"),
                    ("reconnect", "Connection lost, attempt run again"),
                    ("suspend", "Suspended by a pause"),
                    ("unpause", "Unpaused"),
                    ("fork", "Forked as a new run"),
                    ("queue", "Queued for its concurrency key"),
                    ("admit", "Admitted by its concurrency key"),
                    ("throttle", "Delayed by its throttle"),
                    ("debounce", "Start collapsed into the run waiting for its debounce key"),
                    ("batch", "Start added to the run collecting its batch key's items"),
                    ("steer", "Steered"),
                ],
                max_length=18,
                verbose_name="kind",
            ),
        ),
        migrations.AlterField(
            model_name="flowkey",
            name="kind",
            field=models.CharField(
                choices=[
                    ("concurrency", "Concurrency"),
                    ("throttle", "Throttle"),
                    ("debounce", "Debounce"),
                    ("batch", "Batch"),
                ],
                max_length=16,
                verbose_name="kind",
            ),
        ),
        migrations.AddIndex(
            model_name="execution",
            index=models.Index(
                condition=models.Q(
                    ("status", "scheduled"), models.Q(("batch_key", ""), _negated=True)
                ),
                fields=["reactor", "batch_key"],
                name="reactor_exec_batch_idx",
            ),
        ),
        migrations.AddField(
            model_name="batchitem",
            name="execution",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="batch_items",
                to="django_reactor.execution",
                verbose_name="execution",
            ),
        ),
        migrations.AddConstraint(
            model_name="batchitem",
            constraint=models.UniqueConstraint(
                fields=("reactor", "idempotency_key"), name="reactor_batch_item_key_uniq"
            ),
        ),
            migrations.RunPython(create_hold_key, drop_hold_key, elidable=False),
    ]
