"""App configuration for django_reactor."""

from __future__ import annotations

import importlib.util

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DjangoReactorConfig(AppConfig):
    """Registers system checks, imports every installed app's ``reactors`` module, and plugs
    the adapters (Celery's publisher, completion signals) into the store's outbox."""

    name = "django_reactor"
    label = "django_reactor"
    verbose_name = _("Reactor")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: AppConfig modules load before the models do.
        from . import (
            checks,  # noqa: F401  (registers the checks)
            faults,
        )
        from .conf import ReactorSettings, reactor_settings
        from .exceptions import ReactorImproperlyConfigured
        from .registry import autodiscover
        from .runtime import wakeups
        from .store import outbox

        # A broken REACTOR setting must not stop the project from starting: the system checks
        # (E001, E003) explain it. Fall back to the default modules meanwhile.
        try:
            modules = reactor_settings.AUTODISCOVER_MODULES
        except ReactorImproperlyConfigured:
            modules = ReactorSettings.AUTODISCOVER_MODULES.default
        if not isinstance(modules, list | tuple) or not all(isinstance(m, str) for m in modules):
            modules = ReactorSettings.AUTODISCOVER_MODULES.default
        autodiscover(list(modules))
        faults.install()  # crash tests' fault points, armed by REACTOR_FAULTS only
        # The adapters plug into the store's outbox: finished async units wake their waiters,
        # and Celery (when installed) sends the dispatches.
        outbox.on_finished(wakeups.announce)
        outbox.on_progress(wakeups.announce_progress)
        if importlib.util.find_spec("celery") is not None:
            from .celery.router import CeleryPublisher  # registers the shared tasks too

            outbox.register_publisher(CeleryPublisher())
