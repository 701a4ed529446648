"""Who may read and steer executions through the API: Django model permissions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.utils.module_loading import import_string
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from ..conf import reactor_settings

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from ..models import Execution

# The permission each API action needs (custom permissions of the Execution model).
ACTION_PERMISSIONS = {
    "list": "django_reactor.view_execution",
    "retrieve": "django_reactor.view_execution",
    "cancel": "django_reactor.cancel_execution",
    "undo": "django_reactor.undo_execution",
    "retry": "django_reactor.retry_execution",
    "pause": "django_reactor.pause_execution",
    "unpause": "django_reactor.pause_execution",
    "fork": "django_reactor.retry_execution",
    "resume": "django_reactor.resume_interrupt",
    "start": "django_reactor.start_execution",
}


class HasReactorPermission(BasePermission):
    """An authenticated user holding the permission of the view's action."""

    message = "you lack the permission this action needs"

    def has_permission(self, request: Request, view: object) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        action = getattr(view, "action", None)
        if action is None and not hasattr(view, (request.method or "").lower()):
            return True  # a method the endpoint does not take: let the view answer 405
        needed = ACTION_PERMISSIONS.get(action or "")
        if needed is None:
            return False
        if not user.has_perm(needed):
            self.message = f"you lack the {needed} permission"
            return False
        return True


def scoped(request: Request, queryset: QuerySet[Execution]) -> QuerySet[Execution]:
    """Apply ``REACTOR["API_SCOPE"]`` (tenants, owners) to a queryset of executions."""
    path = reactor_settings.API_SCOPE
    if not path:
        return queryset
    scope = import_string(path) if isinstance(path, str) else path
    return scope(request, queryset)


def _classes(setting: Iterable[str | type]) -> list[type]:
    return [import_string(c) if isinstance(c, str) else c for c in setting]


def permission_classes() -> list[type]:
    """``REACTOR["API_PERMISSION_CLASSES"]``, imported."""
    return _classes(reactor_settings.API_PERMISSION_CLASSES or [])


def authentication_classes() -> list[type] | None:
    """``REACTOR["API_AUTHENTICATION_CLASSES"]``, imported; None for DRF's defaults."""
    setting = reactor_settings.API_AUTHENTICATION_CLASSES
    return None if setting is None else _classes(setting)
