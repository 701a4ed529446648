"""Operator actions: permissions, CSRF, bulk actions with confirmation, buttons, resume form."""

from __future__ import annotations

import datetime as dt
import json
import re
from html import escape, unescape
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from rest_framework import serializers

from django_reactor import Reactor, interrupt, services
from django_reactor.engine.validation import error_messages
from django_reactor.models import Execution, Interrupt
from django_reactor.states import ExecutionStatus, InterruptStatus
from tests.admin.reactors import TRIGGERS, Booking, Refund

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:django_reactor_execution_changelist")


class Answers(serializers.Serializer):
    when = serializers.DateField()
    count = serializers.IntegerField(min_value=1, max_value=10)
    tier = serializers.ChoiceField(["silver", "bronze"], required=False)
    tags = serializers.ListField(child=serializers.CharField(), required=False)
    flagged = serializers.BooleanField(required=False)


class Survey(Reactor):
    """Pauses for answers of several kinds: a date, a bounded number, a choice, a list."""

    answers = interrupt(payload=Answers)


class Note(Reactor):
    """Pauses for any JSON object (no serializer)."""

    note = interrupt()


def url(name: str, *args: Any) -> str:
    return reverse(f"admin:django_reactor_execution_{name}", args=[str(a) for a in args])


def status(execution_id: Any) -> str:
    return Execution.objects.get(pk=execution_id).status


def log_messages(execution_id: Any) -> list[str]:
    return list(
        LogEntry.objects.filter(object_id=str(execution_id), action_flag=CHANGE)
        .order_by("id")
        .values_list("change_message", flat=True)
    )


def texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def failed_run() -> Any:
    TRIGGERS.add("charge")
    outcome = Booking.run({"guest": "ann", "card": "4111"})
    TRIGGERS.discard("charge")
    assert outcome.status == ExecutionStatus.FAILED
    return outcome.execution_id


# ---------------------------------------------------------------------------- permissions


def test_a_viewer_sees_no_buttons_and_no_actions(client_viewer: Client) -> None:
    paused = Refund.run({"order": "V1"}).execution_id

    detail = client_viewer.get(url("change", paused)).content.decode()
    changelist = client_viewer.get(CHANGELIST).content.decode()

    assert 'id="reactor-actions"' not in detail
    assert url("resume", paused, "approval") not in detail
    assert 'name="action"' not in changelist
    assert "cancel_selected" not in changelist


@pytest.mark.parametrize("name", ["cancel", "undo", "retry"])
def test_a_viewer_is_refused_the_action_urls(client_viewer: Client, name: str) -> None:
    run = Refund.run({"order": f"V-{name}"}).execution_id

    assert client_viewer.post(url(name, run)).status_code == 403
    assert client_viewer.get(url(name, run)).status_code == 403
    assert status(run) == ExecutionStatus.PAUSED


def test_a_viewer_is_refused_the_resume_form(client_viewer: Client) -> None:
    run = Refund.run({"order": "V2"}).execution_id
    resume = url("resume", run, "approval")

    assert client_viewer.get(resume).status_code == 403
    assert client_viewer.post(resume, {"payload": '{"approved": true}'}).status_code == 403
    assert status(run) == ExecutionStatus.PAUSED


def test_a_viewer_cannot_run_a_bulk_action_by_hand(client_viewer: Client) -> None:
    run = Refund.run({"order": "V3"}).execution_id

    client_viewer.post(
        CHANGELIST, {"action": "cancel_selected", "_selected_action": [str(run)], "post": "yes"}
    )

    assert status(run) == ExecutionStatus.PAUSED
    assert log_messages(run) == []


def test_action_urls_take_post_only_and_check_csrf(operator: Any) -> None:
    run = Refund.run({"order": "X1"}).execution_id
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)

    assert client.get(url("cancel", run)).status_code == 405
    assert client.post(url("cancel", run)).status_code == 403  # no CSRF token
    assert status(run) == ExecutionStatus.PAUSED


# ---------------------------------------------------------------------------- bulk actions


def test_bulk_cancel_confirms_then_cancels_each_run_and_logs_it(client_operator: Client) -> None:
    paused = [Refund.run({"order": f"B{i}"}).execution_id for i in range(2)]
    completed = Booking.run({"guest": "ann", "card": "4111"}).execution_id
    selected = [str(i) for i in [*paused, completed]]

    confirm = client_operator.post(
        CHANGELIST, {"action": "cancel_selected", "_selected_action": selected}
    )

    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert "3 executions selected." in html
    assert 'id="reactor-confirm-states"' in html
    assert "reactor-badge-paused" in html
    assert "reactor-badge-completed" in html
    assert all(status(i) == ExecutionStatus.PAUSED for i in paused)

    done = client_operator.post(
        CHANGELIST,
        {
            "action": "cancel_selected",
            "_selected_action": selected,
            "post": "yes",
            "reason": "duplicate orders",
        },
    )

    assert done.status_code == 302
    assert all(status(i) == ExecutionStatus.CANCELLED for i in paused)
    assert status(completed) == ExecutionStatus.COMPLETED
    messages = texts(done)
    assert "Cancelled 2 executions." in messages
    assert any(str(completed) in m and "completed" in m for m in messages)
    for run in paused:
        assert log_messages(run) == ["Cancel requested: cancelled (duplicate orders)"]
    assert log_messages(completed) == []


def test_bulk_cancel_across_every_page_uses_the_changelist_filters(
    client_operator: Client,
) -> None:
    paused = [Refund.run({"order": f"S{i}"}).execution_id for i in range(3)]
    completed = Booking.run({"guest": "ann", "card": "4111"}).execution_id

    confirm = client_operator.post(
        f"{CHANGELIST}?status__exact=paused",
        {"action": "cancel_selected", "select_across": "1", "_selected_action": [str(paused[0])]},
    )
    assert "3 executions selected." in confirm.content.decode()
    assert 'name="select_across" value="1"' in confirm.content.decode()

    client_operator.post(
        f"{CHANGELIST}?status__exact=paused",
        {
            "action": "cancel_selected",
            "select_across": "1",
            "_selected_action": [str(paused[0])],  # as the confirmation page posts it
            "post": "yes",
        },
    )

    assert [status(i) for i in paused] == [ExecutionStatus.CANCELLED] * 3
    assert status(completed) == ExecutionStatus.COMPLETED


def test_bulk_undo_rolls_back_and_logs(client_operator: Client) -> None:
    runs = [Booking.run({"guest": f"g{i}", "card": "1"}).execution_id for i in range(2)]

    done = client_operator.post(
        CHANGELIST,
        {"action": "undo_selected", "_selected_action": [str(i) for i in runs], "post": "yes"},
    )

    assert [status(i) for i in runs] == [ExecutionStatus.CANCELLED] * 2
    assert "Undid 2 executions." in texts(done)
    assert log_messages(runs[0]) == ["Undone: cancelled"]


def test_bulk_retry_starts_new_runs_and_refuses_others(client_operator: Client) -> None:
    failed = failed_run()
    completed = Booking.run({"guest": "ann", "card": "4111"}).execution_id

    done = client_operator.post(
        CHANGELIST,
        {
            "action": "retry_selected",
            "_selected_action": [str(failed), str(completed)],
            "post": "yes",
        },
    )

    retry = Execution.objects.get(retry_of_id=failed)
    assert retry.status == ExecutionStatus.COMPLETED
    messages = texts(done)
    assert "Retried 1 execution." in messages
    assert any("only failed runs are retried" in m for m in messages)
    assert log_messages(failed) == [f"Retried as {retry.id}"]


# ---------------------------------------------------------------------------- buttons


def test_the_cancel_button_asks_first_then_cancels(client_operator: Client) -> None:
    run = Refund.run({"order": "C1"}).execution_id

    asked = client_operator.post(url("cancel", run), {"reason": "customer called"})
    assert asked.status_code == 200
    page = asked.content.decode()
    assert "Cancel this execution?" in page
    assert "without rolling anything back" in page
    assert 'value="customer called"' in page  # the reason typed on the run's page
    assert status(run) == ExecutionStatus.PAUSED  # nothing happened yet

    response = client_operator.post(
        url("cancel", run), {"reason": "customer called", "post": "yes"}
    )

    assert response.status_code == 302
    assert response["Location"] == url("change", run)
    assert status(run) == ExecutionStatus.CANCELLED
    assert Execution.objects.get(pk=run).cancel_reason == "customer called"
    assert log_messages(run) == ["Cancel requested: cancelled (customer called)"]


def test_the_undo_button_says_what_will_be_undone_then_undoes(client_operator: Client) -> None:
    # A secret no id or hash can contain (a bare "4111" turns up in a random UUID).
    run = Booking.run({"guest": "ann", "card": "card-4111-secret"}).execution_id

    asked = client_operator.post(url("undo", run))
    assert asked.status_code == 200
    page = asked.content.decode()
    assert "Undo this execution?" in page
    steps = page[page.index('id="reactor-confirm-steps"') :]
    steps = steps[: steps.index("</ol>")]
    # Newest first; charge declares no undo, so it is only named.
    assert steps.index("<code>confirm</code>") < steps.index("<code>charge</code>")
    assert steps.index("<code>charge</code>") < steps.index("<code>reserve</code>")
    assert steps.count("declares no undo") == 1
    assert "card-4111-secret" not in page
    assert status(run) == ExecutionStatus.COMPLETED  # nothing happened yet

    client_operator.post(url("undo", run), {"post": "yes"})

    assert status(run) == ExecutionStatus.CANCELLED
    assert log_messages(run) == ["Undone: cancelled"]


def test_the_retry_button_goes_to_the_new_run(client_operator: Client) -> None:
    run = failed_run()

    response = client_operator.post(url("retry", run))

    retry = Execution.objects.get(retry_of_id=run)
    assert response["Location"] == url("change", retry.id)
    assert log_messages(run) == [f"Retried as {retry.id}"]


def test_a_refused_button_says_why(client_operator: Client) -> None:
    run = Booking.run({"guest": "ann", "card": "4111"}).execution_id

    response = client_operator.post(url("retry", run))

    assert status(run) == ExecutionStatus.COMPLETED
    assert any("only failed runs are retried" in m for m in texts(response))
    assert log_messages(run) == []


# ---------------------------------------------------------------------------- resume


def test_the_resume_form_has_an_input_for_each_field_of_the_payload(
    client_operator: Client,
) -> None:
    run = Refund.run({"order": "R1"}).execution_id

    html = client_operator.get(url("resume", run, "approval")).content.decode()

    assert "refund-R1" in html
    assert 'id="reactor-attempts">0 / 2<' in html
    # approved: a BooleanField (a checkbox); note: a CharField(max_length=20), not required.
    assert re.search(r'<input type="checkbox" name="payload-approved"[^>]*>', html)
    note = re.search(r'<input type="text" name="payload-note"[^>]*>', html)
    assert note, html
    assert 'maxlength="20"' in note.group(0)
    assert "required" not in note.group(0)
    assert "Whether the refund may go ahead." in html
    assert "vLargeTextField" not in html  # no JSON to write by hand


def test_resume_with_a_valid_payload_completes_the_run(client_operator: Client) -> None:
    run = Refund.run({"order": "R2"}).execution_id

    response = client_operator.post(
        url("resume", run, "approval"), {"payload-approved": "on", "payload-note": "ok"}
    )

    assert response.status_code == 302
    assert status(run) == ExecutionStatus.COMPLETED
    interrupt = Interrupt.objects.get(execution_id=run)
    assert interrupt.status == InterruptStatus.RESUMED
    assert services.find(run).step("approval").result == {"approved": True, "note": "ok"}
    assert "Payload accepted for approval; the run is now completed." in texts(response)
    assert log_messages(run) == ["Resumed interrupt 'approval'"]

    again = client_operator.post(url("resume", run, "approval"), {"payload-approved": "on"})
    assert again.status_code == 302
    assert texts(again)  # refused with a message (already resumed)
    assert log_messages(run) == ["Resumed interrupt 'approval'"]


def test_an_invalid_payload_says_so_once_under_its_field_and_counts(
    client_operator: Client,
) -> None:
    run = Refund.run({"order": "R3"}).execution_id
    resume = url("resume", run, "approval")

    response = client_operator.post(resume, {"payload-note": "far too long for the field"})

    assert response.status_code == 200
    html = response.content.decode()
    message = "Ensure this field has no more than 20 characters."
    assert html.count(message) == 1
    note = re.search(
        r'<div class="form-row errors field-payload-note">(.*?)</fieldset>', html, re.S
    )
    assert note, html
    assert message in note.group(1)
    assert html.count("invalid payload 1 of 2") == 1
    assert texts(response) == []  # no message besides the page's own note
    assert 'id="reactor-attempts">1 / 2<' in html
    assert status(run) == ExecutionStatus.PAUSED
    assert log_messages(run) == ["Invalid payload for interrupt 'approval' (attempt 1 of 2)"]

    last = client_operator.post(resume, {"payload-note": "x" * 21})

    assert last.status_code == 302
    assert status(run) == ExecutionStatus.FAILED
    assert any("the run was undone and failed" in m for m in texts(last))


def test_the_form_refuses_what_the_api_refuses_with_the_same_messages(
    client_operator: Client, operator: Any
) -> None:
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(operator)
    payloads = [
        (
            {"payload-when": "tomorrow", "payload-count": "many"},
            {"when": "tomorrow", "count": "many"},
        ),
        (
            {"payload-when": "2026-12-03", "payload-count": "0", "payload-tier": "gold"},
            {"when": "2026-12-03", "count": 0, "tier": "gold"},
        ),
    ]
    for form_data, json_payload in payloads:
        by_form = Survey.run({}).execution_id
        by_api = Survey.run({}).execution_id
        page = client_operator.post(url("resume", by_form, "answers"), form_data)
        assert page.status_code == 200
        answer = api.post(
            f"/reactor/executions/{by_api}/resume/", {"payload": json_payload}, format="json"
        )
        assert answer.status_code == 400
        expected = error_messages(answer.data["errors"])
        assert expected
        html = page.content.decode()
        for path, message in expected:
            assert html.count(escape(message)) >= 1, (path, message)
            block = re.search(
                rf'<div class="form-row errors field-payload-{path}">(.*?)</div>', html, re.S
            )
            assert block, (path, html)
            assert escape(message) in block.group(1), (path, message)
        assert Interrupt.objects.get(execution_id=by_form).invalid_attempts == 1


def test_a_field_html_has_no_input_for_is_json_and_malformed_json_is_not_counted(
    client_operator: Client,
) -> None:
    run = Survey.run({}).execution_id
    resume = url("resume", run, "answers")

    html = client_operator.get(resume).content.decode()
    tags = re.search(r'<textarea name="payload-tags"[^>]*>(.*?)</textarea>', html, re.S)
    assert tags, html
    assert json.loads(unescape(tags.group(1))) == [""]  # an example of its shape
    assert re.search(r'<input type="date" name="payload-when"[^>]*required', html)
    assert re.search(r'<select name="payload-tier"', html)

    for text in ("[not json", '["a", '):
        response = client_operator.post(
            resume, {"payload-when": "2026-12-03", "payload-count": "3", "payload-tags": text}
        )
        assert response.status_code == 200
        assert "This is not valid JSON" in response.content.decode()
    assert Interrupt.objects.get(execution_id=run).invalid_attempts == 0
    assert log_messages(run) == []

    done = client_operator.post(
        resume,
        {
            "payload-when": "2026-12-03",
            "payload-count": "3",
            "payload-tier": "silver",
            "payload-tags": '["urgent", "vip"]',
        },
    )
    assert done.status_code == 302
    assert services.find(run).step("answers").result == {
        "when": dt.date(2026, 12, 3),
        "count": 3,
        "tier": "silver",
        "tags": ["urgent", "vip"],
        "flagged": False,
    }


def test_without_a_serializer_the_payload_is_one_json_object(client_operator: Client) -> None:
    run = Note.run({}).execution_id
    resume = url("resume", run, "note")

    for text in ("{not json", "[1, 2]"):
        response = client_operator.post(resume, {"payload": text})
        assert response.status_code == 200
        assert "errorlist" in response.content.decode()
    assert Interrupt.objects.get(execution_id=run).invalid_attempts == 0

    done = client_operator.post(resume, {"payload": '{"anything": [1, 2]}'})
    assert done.status_code == 302
    assert services.find(run).step("note").result == {"anything": [1, 2]}


def test_resume_in_the_background_hands_the_run_to_a_worker(client_operator: Client) -> None:
    run = Refund.run({"order": "R5"}).execution_id

    client_operator.post(
        url("resume", run, "approval"), {"payload-approved": "on", "background": "on"}
    )

    assert status(run) == ExecutionStatus.PENDING
    assert Interrupt.objects.get(execution_id=run).status == InterruptStatus.RESUMED


def test_an_unknown_interrupt_is_not_found(client_operator: Client) -> None:
    run = Refund.run({"order": "R6"}).execution_id
    assert client_operator.get(url("resume", run, "nope")).status_code == 404
