"""The durable runners the engine calls through its protocols, on the store.

- ``children``: composed children and async units, as executions of their own
  (the engine's ``ChildRunner``);
- ``maps``: a map's elements, inline or fanned out to workers (the engine's ``MapRunner``), and
  the element tasks' work;
- ``wakeups``: completion signals (Redis pub/sub) that wake whoever waits for an async unit,
  the database deciding.
"""
