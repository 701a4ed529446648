from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_reactor", "0025_map_tallies"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="dispatch",
            index=models.Index(
                condition=models.Q(("sent_at__isnull", False)),
                fields=["sent_at"],
                name="reactor_dispatch_sent_idx",
            ),
        ),
    ]
