"""Who a request to the resume, message and start endpoints comes from, and whether a reactor
accepts it (``REACTOR["RESUME_AUTH"]``, ``REACTOR["START_AUTH"]``, the webhook secrets' reactor)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .. import registry
from ..conf import ByReactor, ReactorSettings, reactor_settings
from ..engine.actors import MAX_WHO_LENGTH, Actor
from .errors import ApiError

logger = logging.getLogger("django_reactor.api")


class Credential:
    """Who sends a request: its kind (user, webhook, token), its scope for idempotency keys,
    and ``who`` it is in the steering history (never a secret)."""

    def __init__(self, kind: str, scope: str, *, token: str | None = None, group: str = "",
                 webhook_id: str | None = None, who: str = "") -> None:  # fmt: skip
        self.kind = kind
        self.scope = scope
        self.token = token
        self.group = group
        self.webhook_id = webhook_id
        self.who = who

    @property
    def actor(self) -> Actor:
        """Who the steering actions of the request are recorded as: the user, the webhook
        secrets that signed it (by their name in ``WEBHOOK_SECRETS``), or a resume token."""
        return Actor((self.who or self.kind)[:MAX_WHO_LENGTH], "api")


def user_actor(user: Any) -> Actor:
    """An API user as the steering history names them: ``"alice (user 7)"``."""
    return Actor(f"{user.get_username()} (user {user.pk})"[:MAX_WHO_LENGTH], "api")


def check_signed_for(credential: Credential, reactor: str, *, also: str = "") -> None:
    """Refuse a webhook signed with a secret listed for another reactor than ``reactor`` (or
    ``also``); secrets under ``"default"`` sign for every reactor."""
    if credential.kind == "webhook" and credential.group not in ("default", reactor, also):
        raise ApiError(
            401,
            f"the webhook secret that signed this request is not for {reactor}",
            code="bad_signature",
        )


def allowed_modes(
    reactor: str, key: str = "RESUME_AUTH", verb: str = "resume", done: str = "resumed"
) -> list[str]:
    """The credentials ``REACTOR[key]`` (``RESUME_AUTH``, ``START_AUTH``) accepts for runs
    of ``reactor``.

    Fails closed: while a key of the dict names no registered reactor (a typo, a class name,
    check E011), the reactors it does not name accept nothing, for the key may have been meant
    for any of them, and ``"default"`` could accept more than it meant to.
    """
    setting = getattr(reactor_settings, key)
    if not isinstance(setting, Mapping):
        return [str(mode) for mode in setting or ()]
    if reactor in setting:
        return [str(mode) for mode in setting[reactor] or ()]
    unknown = registry.unknown(ByReactor.reactor_keys(setting))
    if unknown:
        logger.error(
            "refused to %s a run of %s: REACTOR[%r] has entries for %s, which name no "
            "registered reactor, so no credential is accepted for the reactors it does not "
            "name (check django_reactor.E011; key each entry by a registered name)",
            verb,
            reactor,
            key,
            ", ".join(repr(name) for name in unknown),
        )
        raise ApiError(
            401,
            f"runs of {reactor} cannot be {done} through the API until the server's "
            f"REACTOR[{key!r}] setting is fixed (it names a reactor that is not "
            "registered; its operators see check django_reactor.E011)",
            code="credential_not_accepted",
        )
    chosen = setting.get(ByReactor.DEFAULT_KEY, getattr(ReactorSettings, key).default)
    return [str(mode) for mode in chosen or ()]
