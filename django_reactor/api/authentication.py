"""The API's authentication: the configured DRF classes, behind a guard against credentials the
database could never hold.

A user name, password or token with a NUL character (``\\u0000``) cannot be stored in a
PostgreSQL text column, so looking it up fails with a ``DataError`` (a 500) instead of not
finding anyone. Base64 hides it in a Basic ``Authorization`` header, where any client can put
it. The API's views refuse such a header with a 400 (code ``invalid_header``) before any
authentication class or backend queries; :class:`BasicAuthentication` does the same for the
project's other DRF views (name it in ``REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]``, as
the example project does for its ``/api/schema/``).
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

from drf_spectacular import authentication as spectacular_authentication
from rest_framework import authentication
from rest_framework.exceptions import APIException

from ..engine.serialization import unstorable
from .permissions import authentication_classes

if TYPE_CHECKING:
    from rest_framework.request import Request


class UnstorableCredentials(APIException):
    """A 400: the ``Authorization`` header holds what no stored credential can contain."""

    status_code = 400
    default_code = "invalid_header"
    default_detail = "the Authorization header cannot be read"


def refuse_unstorable_credentials(request: Request) -> None:
    """Raise UnstorableCredentials when the request's ``Authorization`` header (a Basic
    header's decoded user name and password, or any other scheme's credentials) holds a NUL
    or anything else the database cannot store. A header that is malformed otherwise is left
    to the authentication classes, which refuse it themselves."""
    header = authentication.get_authorization_header(request)
    scheme, _, credentials = header.partition(b" ")
    if not credentials:
        return
    if scheme.lower() == b"basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True)
        except (binascii.Error, ValueError):
            return
        try:  # as DRF's BasicAuthentication reads it
            text = decoded.decode("utf-8")
        except UnicodeDecodeError:
            text = decoded.decode("latin-1")
        refusal = (
            "the user name or password in the Authorization header holds a NUL character "
            "(\\u0000), which no stored user name or password can contain; send it without"
        )
    else:
        text = credentials.decode("latin-1")
        refusal = (
            "the credentials in the Authorization header hold a NUL character (\\u0000), "
            "which no stored credential can contain; send them without it"
        )
    if unstorable(text) is not None:
        raise UnstorableCredentials(refusal)


class ApiAuthentication:
    """Mixin of the API's views: ``REACTOR["API_AUTHENTICATION_CLASSES"]`` (else DRF's
    defaults), reached only by credentials the database can store."""

    def get_authenticators(self) -> list[authentication.BaseAuthentication]:
        configured = authentication_classes()
        if configured is None:
            defaults: list[authentication.BaseAuthentication] = super().get_authenticators()  # type: ignore[misc]
            return defaults
        return [authenticator() for authenticator in configured]

    def perform_authentication(self, request: Request) -> None:
        refuse_unstorable_credentials(request)
        super().perform_authentication(request)  # type: ignore[misc]


class BasicAuthentication(authentication.BasicAuthentication):
    """DRF's HTTP Basic authentication, refusing (400) a user name or password with a NUL
    before the authentication backend looks the user up."""

    def authenticate(self, request: Request) -> Any:
        refuse_unstorable_credentials(request)
        return super().authenticate(request)


class BasicScheme(spectacular_authentication.BasicScheme):
    """The OpenAPI security scheme of :class:`BasicAuthentication`: HTTP basic, as DRF's."""

    target_class = "django_reactor.api.authentication.BasicAuthentication"
