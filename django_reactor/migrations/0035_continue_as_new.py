"""Continue-as-new: a run's successor (``continued_from``, one at most: the one-to-one's
unique constraint refuses a second) and its generation in the lineage, and the ``continue``
trace entry."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_reactor', '0034_batches'),
    ]

    operations = [
        migrations.AddField(
            model_name='execution',
            name='continued_from',
            field=models.OneToOneField(blank=True, help_text='The run this one continues: its last step returned ContinueAsNew, and this run was created with its final checkpoint. A run has at most one successor.', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='continued_as', to='django_reactor.execution', verbose_name='continued from'),
        ),
        migrations.AddField(
            model_name='execution',
            name='generation',
            field=models.PositiveIntegerField(db_default=0, default=0, help_text='How many runs came before this one in its continue-as-new lineage (0: the first).', verbose_name='generation'),
        ),
        migrations.AlterField(
            model_name='executionevent',
            name='kind',
            field=models.CharField(choices=[('start', 'Run started'), ('run', 'Step ran'), ('retry', 'Step attempt failed, retrying'), ('fail', 'Failed'), ('skip', 'Step skipped'), ('halt', 'Halted'), ('compensate', 'Step compensated'), ('compensate_failed', 'Compensation failed'), ('compensate_skipped', 'No compensation defined'), ('undo', 'Step undone'), ('undo_failed', 'Undo failed'), ('undo_skipped', 'No undo defined'), ('complete', 'Run completed'), ('abort', 'Run aborted'), ('hand_back', 'Worker interrupted, run handed back'), ('cancel', 'Run cancelled'), ('rollback', 'Rollback started'), ('rerun', 'Run retried as a new execution'), ('handoff', 'Handed off to a worker'), ('resume', 'Resumed by a worker'), ('attention', 'Needs attention'), ('dispatch', 'Async unit dispatched'), ('park', 'Waiting for an async result'), ('interrupt', 'Interrupt reached'), ('pause', 'Paused for a payload'), ('payload', 'Payload accepted'), ('invalid_payload', 'Invalid payload refused'), ('expire', 'Interrupt expired'), ('map', 'Map elements started'), ('acquire', 'Coordination acquired'), ('launch', 'Steps started side by side'), ('sleep', 'Sleeping until a time'), ('deadline', 'Deadline passed'), ('timeout', 'Step attempt timed out'), ('reconnect', 'Connection lost, attempt run again'), ('suspend', 'Suspended by a pause'), ('unpause', 'Unpaused'), ('fork', 'Forked as a new run'), ('continue', 'Continued as a new run'), ('queue', 'Queued for its concurrency key'), ('admit', 'Admitted by its concurrency key'), ('throttle', 'Delayed by its throttle'), ('debounce', 'Start collapsed into the run waiting for its debounce key'), ('batch', "Start added to the run collecting its batch key's items"), ('steer', 'Steered')], max_length=18, verbose_name='kind'),
        ),
    ]
