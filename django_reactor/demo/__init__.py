"""The sagas ``python manage.py reactor_demo`` runs, shipped with the package.

Nothing here is imported unless the command runs: its reactors are registered only in the
command's own process, so they never show up among a project's reactors. The shop they change
(:mod:`.shop`) lives in plain Python objects, so the demo needs no models and no migrations of
its own; the runs themselves are stored in django_reactor's tables, like any other run.
"""
