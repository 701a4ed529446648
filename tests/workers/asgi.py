"""What the ASGI test's server serves (``tests/workers/test_asgi.py``): a view that starts a
background run with ``await Reactor.arun`` and answers once ``await handle.await_outcome``
returns; its reactor's second step has an ``async def`` body the workers run."""

from __future__ import annotations

import asyncio

from django.http import HttpRequest, JsonResponse
from django.urls import path
from rest_framework import serializers

from django_reactor import Completed, Reactor, arg, step, step_context
from django_reactor.models import Execution


class Doubles(Reactor):
    class Inputs(serializers.Serializer):
        n = serializers.IntegerField()

    @step(n=arg.input("n"))
    def take(n: int) -> int:
        return n

    @step(n=arg.result("take"))
    async def double(n: int) -> int:
        await asyncio.sleep(0)
        # The async ORM, from a body a worker runs in an event loop.
        assert await Execution.objects.filter(pk=step_context().execution_id).aexists()
        return n * 2

    class Meta:
        returns = "double"
        background = "all"


async def run_and_wait(request: HttpRequest) -> JsonResponse:
    try:
        started = await Doubles.arun({"n": int(request.GET["n"])})
        handle = await Doubles.afind(started.execution_id)
        outcome = await handle.await_outcome(timeout=60)
    except Exception as exc:  # the test reads which, SynchronousOnlyOperation above all
        return JsonResponse({"error": f"{type(exc).__qualname__}: {exc}"}, status=500)
    if not isinstance(outcome, Completed):
        return JsonResponse({"error": repr(outcome)}, status=500)
    return JsonResponse({"value": outcome.value, "execution_id": str(handle.id)})


urlpatterns = [path("run-and-wait/", run_and_wait)]
