"""The Python shell of a tutorial: ``python manage.py shell`` with a doctest runner.

Reads one JSON request a line on standard input, ``{"source": <pycon text>, "name": ...,
"lineno": ...}``, runs its examples in one namespace kept from block to block (as the reader's
shell keeps its variables), and answers one JSON line: ``{"failures": n, "report": text}``.
``{"expression": "..."}`` answers ``{"value": repr}`` (how the test reads the run's id).
Outputs are compared as doctest does, with ``ELLIPSIS`` and ``NORMALIZE_WHITESPACE``, after the
values that differ from run to run (ids, times, durations) are replaced on both sides
(``tests.docs.normalise``).
"""

from __future__ import annotations

import doctest
import io
import json
import sys

import django


def main() -> None:
    django.setup()  # what manage.py shell does; the project's reactors are imported here

    from tests.docs.normalise import normalise

    class Checker(doctest.OutputChecker):
        def check_output(self, want: str, got: str, optionflags: int) -> bool:
            return super().check_output(normalise(want), normalise(got), optionflags)

    namespace: dict[str, object] = {"__name__": "__main__"}
    parser = doctest.DocTestParser()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    for line in sys.stdin:
        request = json.loads(line)
        if "expression" in request:
            answer = {"value": str(eval(request["expression"], namespace))}
        else:
            test = parser.get_doctest(
                request["source"], namespace, request["name"], request["name"], request["lineno"]
            )
            runner = doctest.DocTestRunner(checker=Checker(), optionflags=flags)
            report = io.StringIO()
            runner.run(test, out=report.write, clear_globs=False)
            namespace = test.globs  # DocTest copies the namespace it is given
            answer = {"failures": runner.failures, "report": report.getvalue()}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
