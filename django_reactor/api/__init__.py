"""The HTTP API (Django REST framework): read executions, steer them, resume interrupts.

Include it in your project's ``urls.py``::

    path("reactor/", include("django_reactor.api.urls")),
"""
