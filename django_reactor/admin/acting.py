"""Who the admin's steering actions are recorded as: the signed-in user, by user name and id
(``"alice (user 7)"``, via ``"admin"``), set for the time each admin view of django_reactor
runs (``DatabaseAdmin``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.http import HttpRequest

from ..engine.actors import MAX_WHO_LENGTH, Actor, acting_as


def actor_of(request: HttpRequest) -> Actor | None:
    """The request's user as an actor; None before sign-in (the view sends them to log in)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return Actor(f"{user.get_username()} (user {user.pk})"[:MAX_WHO_LENGTH], "admin")


@contextlib.contextmanager
def acting_for(request: HttpRequest) -> Iterator[None]:
    """Record the steering actions made inside the block as the request's user's."""
    actor = actor_of(request)
    if actor is None:
        yield
        return
    with acting_as(actor):
        yield
