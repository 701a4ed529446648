"""The run page of a run that continued as new links its predecessor and its successor, and its
trace says so."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework import serializers

from django_reactor import Completed, ContinueAsNew, Reactor, Step, arg, step

pytestmark = pytest.mark.django_db


class Round(serializers.Serializer[dict[str, Any]]):
    round = serializers.IntegerField(min_value=0)


class NextRound(Step):
    def run(self, round: int) -> Any:
        return ContinueAsNew({"round": round + 1}) if round < 1 else {"last": round}


class Rounds(Reactor):
    class Inputs(Round):
        pass

    next_round = step(NextRound, round=arg.input("round"))


def detail(execution_id: Any) -> str:
    return reverse("admin:django_reactor_execution_change", args=[str(execution_id)])


def test_a_run_that_continued_as_new_links_both_ways(client_operator: Client) -> None:
    first = Rounds.run({"round": 0})
    assert isinstance(first, Completed)
    assert first.continued_as is not None

    html = client_operator.get(detail(first.execution_id)).content.decode()
    assert f'class="reactor-continued-as" href="{detail(first.continued_as)}"' in html
    assert "continued-from" not in html
    assert "Continued as a new run" in html  # the trace entry

    html = client_operator.get(detail(first.continued_as)).content.decode()
    assert f'class="reactor-continued-from" href="{detail(first.execution_id)}"' in html
    assert "generation 1" in html
    assert "reactor-continued-as" not in html  # it has not run yet: no successor
