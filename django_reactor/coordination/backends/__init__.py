"""Coordination backends: ``redis.RedisBackend`` and ``database.DatabaseBackend``.

Both implement :class:`~django_reactor.coordination.backends.base.CoordinationBackend`; pick one
with ``REACTOR["COORDINATION_BACKEND"]`` and get it with
:func:`django_reactor.coordination.get_backend`.
"""
