"""Maps in the executions API: summaries, never element lists."""

from __future__ import annotations

import pytest

from django_reactor import Completed, Failed
from tests.api.conftest import client_for, user_with
from tests.integration.reactors import FAIL_AT
from tests.integration.test_maps import Basket, Tolerant

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_detail_shows_each_map_as_a_summary() -> None:
    outcome = Basket.run({"order_id": 1, "items": list(range(1, 31))})
    assert isinstance(outcome, Completed)
    response = client_for(user_with("view_execution")).get(
        f"/reactor/executions/{outcome.execution_id}/"
    )
    assert response.status_code == 200
    body = response.json()
    (summary,) = body["maps"]
    assert summary["step"] == "lines"
    assert (summary["total"], summary["succeeded"], summary["failed"]) == (30, 30, 0)
    assert summary["failures"] == []
    lines = next(s for s in body["steps"] if s["name"] == "lines")
    assert lines["result"] == {"map_results": summary["map_id"]}
    assert "items" not in str(lines["result"])


def test_a_tolerant_map_summary_samples_its_failures() -> None:
    FAIL_AT.update({f"item-{i}" for i in range(1, 30)})
    outcome = Tolerant.run({"items": list(range(1, 41))})
    assert isinstance(outcome, Failed)  # 29 failures are more than max_failures=2
    response = client_for(user_with("view_execution")).get(
        f"/reactor/executions/{outcome.execution_id}/"
    )
    (summary,) = response.json()["maps"]
    assert summary["failed"] == 3  # it stopped once past its threshold
    assert summary["not_started"] == 37
    assert [f["index"] for f in summary["failures"]] == [0, 1, 2]
    assert summary["failures"][0]["exception_class"] == "RuntimeError"
    assert summary["failures"][0]["message"] == "card declined for 1"
    assert summary["failures_truncated"] is False
