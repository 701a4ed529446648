"""The pure saga engine: definitions, planner, the executor core and its constructs. No ORM, no
Celery, no DRF imports."""
