"""The chaos soak's reactors, settings and Celery hooks (driven by ``benchmarks/chaos_soak.py``)."""

from __future__ import annotations

#: Signs the soak's resume webhooks (a fixed test value, not a secret). The driver signs with it
#: and ``tests.chaos.settings`` configures it; kept here so the driver needs no Django settings.
WEBHOOK_SECRET = "whsec_" + "Y2hhb3Mtc29hay13ZWJob29rLXNpZ25pbmcta2V5IQ=="
