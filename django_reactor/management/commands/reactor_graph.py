"""Draw a reactor's steps as Mermaid, Graphviz DOT or SVG, optionally coloured by a stored run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import graph, registry, store
from django_reactor.management.commandtools import (
    ReactorCommand,
    expand_execution_id,
    reactor_name,
)
from django_reactor.models import Execution, StepRecord

FORMATS = ("mermaid", "dot", "svg")


class Command(ReactorCommand):
    help = (
        "Draw the steps of a reactor and the dependencies between them, as a Mermaid flowchart "
        "(the default), a Graphviz DOT graph or a self-contained SVG image. With --execution, "
        "each step is coloured by how far that stored run got (completed, failed, undone, "
        "waiting, ...)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "reactor",
            nargs="?",
            help="The reactor to draw: its registered name (Meta.name or the class's dotted "
            "path, such as myapp.reactors.PlaceOrder), or its class name when that is unique. "
            "May be left out with --execution: the run's own reactor is drawn.",
        )
        parser.add_argument(
            "--format",
            choices=FORMATS,
            default="mermaid",
            help="mermaid (a 'flowchart TD' for Markdown and GitHub), dot (for Graphviz: "
            "dot -Tpng) or svg (an image for browsers, with light and dark colours). "
            "Default: mermaid.",
        )
        parser.add_argument(
            "--output",
            "-o",
            metavar="FILE",
            help="Write the drawing to FILE instead of standard output (- is standard output).",
        )
        parser.add_argument(
            "--execution",
            metavar="ID",
            help="Colour every step by its state in this stored run (an execution id, or its "
            "first 8 or more characters): "
            "completed, failed, undone, compensated, skipped, halted, running, parked, waiting "
            "or pending (not reached).",
        )
        parser.add_argument(
            "--direction",
            choices=("LR", "TB"),
            default="LR",
            help="With --format svg: lay the steps out left to right (LR, the default) or top "
            "to bottom (TB).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name: str | None = options["reactor"]
        execution = None
        if options["execution"] is not None:
            execution = self._execution(options["execution"])
            if name is None:
                name = execution.reactor
        if name is None:
            raise CommandError(
                "name the reactor to draw (for example myapp.reactors.PlaceOrder), or give "
                "--execution ID to draw that run's reactor"
            )
        reactor = self._reactor(name)
        definition = reactor.definition

        states: dict[str, str] | None = None
        title = definition.name
        if execution is not None:
            if execution.reactor != definition.name:
                raise CommandError(
                    f"execution {execution.pk} is a run of {execution.reactor}, not of "
                    f"{definition.name}; leave the reactor out to draw the run's own reactor"
                )
            records = StepRecord.objects.filter(execution=execution).order_by("seq", "id")
            states = graph.step_states(
                execution, records, store.stored_shape(execution, strict=False)
            )
            title = f"{definition.name} · execution {execution.pk} ({execution.status})"

        fmt = options["format"]
        if fmt == "mermaid":
            text = graph.to_mermaid(definition, states)
        elif fmt == "dot":
            text = graph.to_dot(definition, states)
        else:
            text = graph.render_svg(definition, states, title=title, direction=options["direction"])

        output = options["output"]
        if output is None or output == "-":
            self.stdout.write(text, ending="")
            return
        path = Path(output)
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot write {output}: {exc.strerror or exc}") from exc
        if options["verbosity"] >= 1:
            self.stderr.write(f"wrote the {fmt} drawing of {definition.name} to {output}")

    def _execution(self, value: str) -> Execution:
        try:
            return Execution.objects.get(pk=expand_execution_id(value, option="--execution"))
        except Execution.DoesNotExist:
            raise CommandError(f"--execution {value}: no such execution in this database") from None

    def _reactor(self, name: str) -> Any:
        return registry.get(reactor_name(name, option="reactor"))
