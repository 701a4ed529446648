"""App configuration for django_reactor."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DjangoReactorConfig(AppConfig):
    """Registers system checks and imports every installed app's ``reactors`` module."""

    name = "django_reactor"
    label = "django_reactor"
    verbose_name = _("Reactor")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the checks)
        from .conf import reactor_settings
        from .registry import autodiscover

        autodiscover(list(reactor_settings.AUTODISCOVER_MODULES))
