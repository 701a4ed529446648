"""App configuration for django_reactor."""

from __future__ import annotations

import importlib.util

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DjangoReactorConfig(AppConfig):
    """Registers system checks and imports every installed app's ``reactors`` module."""

    name = "django_reactor"
    label = "django_reactor"
    verbose_name = _("Reactor")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401  (registers the checks)
            faults,
        )
        from .conf import DEFAULTS, reactor_settings
        from .exceptions import ReactorImproperlyConfigured
        from .registry import autodiscover

        # A broken REACTOR setting must not stop the project from starting: the system checks
        # (E001, E003) explain it. Fall back to the default modules meanwhile.
        try:
            modules = reactor_settings.AUTODISCOVER_MODULES
        except ReactorImproperlyConfigured:
            modules = DEFAULTS["AUTODISCOVER_MODULES"]
        if not isinstance(modules, list | tuple) or not all(isinstance(m, str) for m in modules):
            modules = DEFAULTS["AUTODISCOVER_MODULES"]
        autodiscover(list(modules))
        faults.install()  # crash tests' fault points, armed by REACTOR_FAULTS only
        if importlib.util.find_spec("celery") is not None:
            from .celery import tasks  # noqa: F401  (registers the shared tasks)
