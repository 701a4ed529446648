"""The resume endpoints' rate limit (``REACTOR["API_RESUME_RATE"]``), per client."""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from ..conf import reactor_settings


class ResumeRateThrottle(SimpleRateThrottle):
    """At most ``API_RESUME_RATE`` resume requests per user, else per client address.

    Counts every attempt (also failed signatures and unknown tokens, so guessing is slowed).
    It uses Django's default cache: give it a shared cache (Redis) when you run several web
    processes.
    """

    scope = "reactor_resume"

    def __init__(self) -> None:  # the rate is read per request, never at import time
        pass

    def get_rate(self) -> str | None:
        return reactor_settings.API_RESUME_RATE

    def allow_request(self, request: Request, view: object) -> bool:
        self.rate = self.get_rate()
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request: Request, view: object) -> str:
        user = getattr(request._request, "user", None)
        if user is not None and user.is_authenticated:
            ident = f"user-{user.pk}"
        else:
            ident = self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}
