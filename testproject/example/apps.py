"""The example shop app used by the demo and the tests."""

from __future__ import annotations

from django.apps import AppConfig


class ExampleConfig(AppConfig):
    """A tiny shop: products with stock, orders, payments and shipments."""

    name = "testproject.example"
    label = "example"
    default_auto_field = "django.db.models.BigAutoField"
