"""Running map elements in memory: what a runner works out once holds for every element."""

from __future__ import annotations

import uuid
from typing import Any

from django_reactor import Reactor, Step, arg, map_over, step, step_context
from django_reactor.engine.elements import (
    ElementRunner,
    RunningElement,
    current_element,
    element_id,
    run_element,
)

seen: list[RunningElement | None] = []
identities: list[uuid.UUID | None] = []


def noted(item: int) -> int:
    seen.append(current_element())
    identities.append(step_context().execution_id)
    return item


class Kept(Step):
    def run(self, **arguments: Any) -> Any:
        return arguments["item"]

    def undo(self, result: Any, **arguments: Any) -> None:
        """Nothing to undo here: only what the element stores for it is tested."""


class Maps(Reactor):
    each = map_over(arg.value([1, 2]), noted, item=arg.element())


class Undoing(Reactor):
    plain = step(noted, item=arg.input("item"))
    kept = step(Kept, item=arg.input("item"), wait_for=["plain"])


def test_a_runner_gives_every_element_the_identity_element_id_gives() -> None:
    map_id = uuid.uuid4()
    runner = ElementRunner(Maps.definition.by_name["each"].map.element_definition, map_id)
    identities.clear()
    for index in (0, 1, 41):
        runner.run_at(index, {"item": index})
    assert identities == [element_id(map_id, index) for index in (0, 1, 41)]


def test_an_element_a_runner_runs_is_the_current_element_while_it_runs() -> None:
    map_id = uuid.uuid4()
    runner = ElementRunner(Maps.definition.by_name["each"].map.element_definition, map_id)
    seen.clear()
    done = runner.run_at(7, {"item": 3})
    assert (done.status, done.value, done.undo) == ("succeeded", 3, None)
    assert seen == [RunningElement(map_id, 7)]
    assert current_element() is None


def test_a_completed_element_keeps_what_its_undoing_steps_need() -> None:
    done = run_element(Undoing.definition, {"item": 4})
    assert done.status == "succeeded"
    assert done.undo == {"steps": ["kept"], "results": {"plain": 4, "kept": 4}}
