"""Continue-as-new on a real worker, killed inside the continuing step and right after the
checkpoint that creates the successor: every generation runs its effect once, and the lineage
has exactly one successor per run."""

from __future__ import annotations

from typing import Any

from django_reactor import services
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from testproject.example.models import BodyRun, Effect
from tests.workers.harness import wait_until
from tests.workers.reactors import Renewal

LAST = 20


def test_a_killed_worker_loses_no_generation_and_doubles_none(start_worker: Any) -> None:
    start_worker(faults="after_effect@renew=kill:once;after_step_commit@renew=kill:once")
    first = services.run_in_background(Renewal, {"month": 0, "last": LAST}).execution_id
    runs = Execution.objects.filter(reactor=Renewal.definition.name)

    def all_done() -> bool:
        services.sweep()  # as beat would: recovers the runs of the killed pool processes
        return runs.filter(status=ExecutionStatus.COMPLETED).count() == LAST + 1

    wait_until(all_done, timeout=120, what=f"{LAST + 1} generations to complete")
    rows = {row.generation: row for row in runs}
    assert sorted(rows) == list(range(LAST + 1))
    assert rows[0].id == first
    for generation in range(1, LAST + 1):
        assert rows[generation].continued_from_id == rows[generation - 1].id
        assert rows[generation].inputs["month"] == generation
    # Each generation's effect happened once; the killed body ran twice, the rest once.
    assert Effect.objects.filter(execution_id__in=[r.id for r in rows.values()]).count() == LAST + 1
    body_runs = sorted(
        BodyRun.objects.filter(execution_id__in=[r.id for r in rows.values()]).values_list(
            "execution_id", flat=True
        )
    )
    assert len(body_runs) == LAST + 2
    assert sum(row.recovery_attempts for row in rows.values()) >= 1
    assert services.find(rows[LAST].id).outcome.value == {"renew": {"ended_at": LAST}}
