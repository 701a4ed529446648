"""The pure saga engine: definitions, planner, executor. No ORM, no Celery, no DRF imports."""
