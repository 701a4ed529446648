"""Secrets at rest: sealed in every column they reach, opened where the run needs them, shown
redacted, rotated to a new key (also while runs run), and erased with their subject."""

from __future__ import annotations

import io
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client, override_settings
from django.urls import reverse
from rest_framework import serializers
from rest_framework.test import APIClient

from django_reactor import (
    Completed,
    Failed,
    Paused,
    Reactor,
    arg,
    interrupt,
    services,
    step,
    store,
)
from django_reactor.engine.redaction import ERASED, REDACTED
from django_reactor.engine.sealing import payloads
from django_reactor.engine.serialization import TAG
from django_reactor.exceptions import SubjectErased
from django_reactor.models import Execution, Interrupt, StepRecord, SubjectKey
from django_reactor.states import ExecutionStatus
from django_reactor.store.db import db_id

pytestmark = pytest.mark.django_db(transaction=True)

CARD = "4242-card-secret"
API_KEY = "sk_live_result_secret"
PIN = "pin-8812-secret"
SECRETS = (CARD, API_KEY, PIN)
OLD_KEY = Fernet.generate_key().decode()
NEW_KEY = Fernet.generate_key().decode()

#: What the step bodies received, by step: the run's values, never the redacted ones.
received: list[tuple[str, Any]] = []
_received_lock = threading.Lock()


def note(step_name: str, value: Any) -> Any:
    with _received_lock:
        received.append((step_name, value))
    return value


class Pin(serializers.Serializer):
    approved = serializers.BooleanField()
    pin = serializers.CharField(write_only=True)


class Checkout(Reactor):
    """A write_only input, an argument made of it, a secret result, a payload's secret."""

    class Inputs(serializers.Serializer):
        email = serializers.EmailField()
        card = serializers.CharField(write_only=True)

    @step(card=arg.input("card"), email=arg.input("email"), secret_result="api_key")
    def charge(card: str, email: str) -> dict[str, Any]:
        note("charge", card)
        return {"api_key": API_KEY, "charge_id": 7, "email": email}

    approval = interrupt(after=["charge"], payload=Pin)

    @step(key=arg.result("charge", "api_key"), pin=arg.result("approval", "pin"))
    def confirm(key: str, pin: str) -> dict[str, Any]:
        note("confirm", (key, pin))
        return {"confirmed": True}

    class Meta:
        name = "tests.secrets.Checkout"


class CheckoutInBackground(Checkout):
    approval = interrupt(after=["charge"], payload=Pin, resume="background")

    @step(key=arg.result("charge", "api_key"), pin=arg.result("approval", "pin"))
    def confirm(key: str, pin: str) -> dict[str, Any]:
        note("confirm", (key, pin))
        return {"confirmed": True}

    class Meta:
        name = "tests.secrets.CheckoutInBackground"


class CustomerCheckout(Checkout):
    """The same, its secrets sealed with the key of the customer."""

    class Inputs(serializers.Serializer):
        email = serializers.EmailField()
        card = serializers.CharField(write_only=True)
        customer_id = serializers.CharField()

    class Meta:
        name = "tests.secrets.CustomerCheckout"
        subject = arg.input("customer_id")


class CustomerCheckoutInBackground(CustomerCheckout):
    approval = interrupt(after=["charge"], payload=Pin, resume="background")

    @step(key=arg.result("charge", "api_key"), pin=arg.result("approval", "pin"))
    def confirm(key: str, pin: str) -> dict[str, Any]:
        note("confirm", (key, pin))
        return {"confirmed": True}

    class Meta:
        name = "tests.secrets.CustomerCheckoutInBackground"
        subject = arg.input("customer_id")


class Quick(Reactor):
    """A run that completes at once with a secret input, argument and result."""

    class Inputs(serializers.Serializer):
        card = serializers.CharField(write_only=True)

    @step(card=arg.input("card"), secret_result=True)
    def token(card: str) -> str:
        note("token", card)
        return f"tok-{card}"

    class Meta:
        name = "tests.secrets.Quick"
        returns = "token"


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    received.clear()
    yield
    received.clear()


def keys(*configured: str) -> Any:
    return override_settings(REACTOR={**settings.REACTOR, "ENCRYPTION_KEYS": list(configured)})


def _as_text(table: str) -> str:
    """A select list giving each row of ``table`` (aliased ``t``) as one text."""
    if connection.vendor == "postgresql":
        return "row_to_json(t)::text"
    return "*"  # MariaDB: the columns as they are (its JSON columns hold text)


def raw_rows(execution_id: uuid.UUID) -> str:
    """Every column of every row a run wrote, as the database holds it (raw SQL)."""
    tables = {
        Execution._meta.db_table: "id",
        StepRecord._meta.db_table: "execution_id",
        Interrupt._meta.db_table: "execution_id",
        "django_reactor_executionevent": "execution_id",
        "django_reactor_dispatch": "execution_id",
    }
    text = []
    with connection.cursor() as cursor:
        for table, column in tables.items():
            cursor.execute(
                f"SELECT {_as_text(table)} FROM {table} t WHERE {column} = %s",
                [_db(execution_id)],
            )
            text.extend(" ".join(map(str, row)) for row in cursor.fetchall())
        table = "django_reactor_apirequest"
        cursor.execute(f"SELECT {_as_text(table)} FROM {table} t")
        text.extend(" ".join(map(str, row)) for row in cursor.fetchall())
    return "\n".join(text)


def _db(value: Any) -> Any:
    """A run's id as raw SQL compares it (MariaDB keeps UUIDs as 32 hex digits)."""
    return db_id(value) if isinstance(value, uuid.UUID) else value


def raw_column(table: str, column: str, where: str, params: list[Any]) -> Any:
    text = f"{column}::text" if connection.vendor == "postgresql" else column
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {text} FROM {table} WHERE {where}", [_db(p) for p in params])
        row = cursor.fetchone()
    return json.loads(row[0])


def tokens(execution_id: uuid.UUID) -> list[dict[str, Any]]:
    """The envelope payload of every sealed secret the run stored."""
    found: list[dict[str, Any]] = []
    row = Execution.objects.get(pk=execution_id)
    for value in (row.inputs, row.result):
        found.extend(payloads(value))
    for record in StepRecord.objects.filter(execution_id=execution_id):
        found.extend(payloads(record.arguments))
        found.extend(payloads(record.result))
    for interrupt_row in Interrupt.objects.filter(execution_id=execution_id):
        found.extend(payloads(interrupt_row.payload))
    return found


def checkout(reactor: type[Reactor] = Checkout, **extra: Any) -> Any:
    return reactor.run({"email": "ada@example.com", "card": CARD, **extra})


def test_the_raw_columns_hold_no_plaintext_of_a_secret_and_the_steps_get_the_values() -> None:
    paused = checkout()
    assert isinstance(paused, Paused)
    done = services.resume_interrupt(
        paused.execution_id, step="approval", payload={"approved": True, "pin": PIN}
    )
    assert isinstance(done, Completed)
    # The step bodies got the values themselves, inline.
    assert received == [("charge", CARD), ("confirm", (API_KEY, PIN))]

    stored = raw_rows(paused.execution_id)
    for secret in SECRETS:
        assert secret not in stored
    # What is not secret stays plain JSON, queryable.
    assert "ada@example.com" in stored
    inputs = raw_column(Execution._meta.db_table, "inputs", "id = %s", [paused.execution_id])
    assert inputs["email"] == "ada@example.com"
    assert set(inputs["card"]) == {TAG, "v"}
    assert inputs["card"][TAG] == "secret"
    assert set(inputs["card"]["v"]) == {"token"}  # no subject: the configured keys sealed it
    # Without ENCRYPTION_KEYS, with the key HKDF derives from SECRET_KEY.
    assert not settings.REACTOR.get("ENCRYPTION_KEYS")
    derived = Fernet(store.keyring.derived_key(settings.SECRET_KEY))
    assert json.loads(derived.decrypt(inputs["card"]["v"]["token"].encode())) == CARD
    charge = raw_column(
        StepRecord._meta.db_table,
        "result",
        "execution_id = %s AND step = %s",
        [paused.execution_id, "charge"],
    )
    assert charge["charge_id"] == 7
    assert charge["api_key"][TAG] == "secret"
    payload = raw_column(
        Interrupt._meta.db_table, "payload", "execution_id = %s", [paused.execution_id]
    )
    assert payload["approved"] is True
    assert payload["pin"][TAG] == "secret"
    assert Execution.objects.filter(inputs__email="ada@example.com").count() == 1

    # Every display shows them redacted.
    handle = Checkout.find(paused.execution_id)
    assert handle.inputs == {"email": "ada@example.com", "card": REDACTED}
    assert handle.step("charge").arguments == {"card": REDACTED, "email": "ada@example.com"}
    assert handle.step("charge").result == {
        "api_key": REDACTED,
        "charge_id": 7,
        "email": "ada@example.com",
    }
    assert handle.step("approval").result == {"approved": True, "pin": REDACTED}
    assert handle.step("confirm").arguments == {"key": REDACTED, "pin": REDACTED}


def test_a_secret_result_returned_as_the_runs_value_is_sealed_and_shown_redacted() -> None:
    outcome = Quick.run({"card": CARD})
    assert isinstance(outcome, Completed)
    assert outcome.value == f"tok-{CARD}"  # the caller gets it
    assert CARD not in raw_rows(outcome.execution_id)
    shown = Quick.find(outcome.execution_id)
    assert shown.outcome.value == REDACTED
    assert services.shown_outcome(outcome).value == REDACTED  # what the API, commands show
    out = io.StringIO()
    call_command("reactor_show", str(outcome.execution_id), stdout=out)
    assert CARD not in out.getvalue()
    assert REDACTED in out.getvalue()


def test_a_worker_resumed_run_gets_the_values_opened() -> None:
    paused = checkout(CheckoutInBackground)
    received.clear()
    accepted = services.resume_interrupt(
        paused.execution_id, step="approval", payload={"approved": True, "pin": PIN}
    )
    assert accepted.status == ExecutionStatus.PENDING  # handed to a worker
    finished = services.resume(paused.execution_id)  # what the worker's task does
    assert isinstance(finished, Completed)
    # The worker read the result and the payload back from the database, and opened them.
    assert received == [("confirm", (API_KEY, PIN))]
    for secret in SECRETS:
        assert secret not in raw_rows(paused.execution_id)


def test_rows_written_in_clear_keep_working_and_rotation_seals_them() -> None:
    paused = checkout()
    # A run stored before secrets were sealed: its secrets in clear.
    Execution.objects.filter(pk=paused.execution_id).update(
        inputs={"email": "ada@example.com", "card": CARD}
    )
    StepRecord.objects.filter(execution_id=paused.execution_id, step="charge").update(
        arguments={"card": CARD, "email": "ada@example.com"}
    )
    assert Checkout.find(paused.execution_id).inputs["card"] == REDACTED
    out = io.StringIO()
    call_command("reactor_rotate_keys", "--batch-size", "1", stdout=out)
    assert "sealed from clear" in out.getvalue()
    assert CARD not in raw_rows(paused.execution_id)
    again = io.StringIO()
    call_command("reactor_rotate_keys", "--json", stdout=again)
    assert json.loads(again.getvalue())["sealed"] == 0  # idempotent
    assert json.loads(again.getvalue())["rotated"] == 0
    done = services.resume_interrupt(
        paused.execution_id, step="approval", payload={"approved": True, "pin": PIN}
    )
    assert isinstance(done, Completed)
    assert received[-1] == ("confirm", (API_KEY, PIN))


def test_two_keys_rotate_then_the_old_key_goes_and_runs_still_resume() -> None:
    with keys(OLD_KEY):
        paused = checkout(CheckoutInBackground)
        old_tokens = tokens(paused.execution_id)
    assert old_tokens
    for payload in old_tokens:
        Fernet(OLD_KEY).decrypt(payload["token"].encode())
    with keys(NEW_KEY, OLD_KEY):
        out = io.StringIO()
        call_command("reactor_rotate_keys", "--batch-size", "2", stdout=out)
        lines = out.getvalue().splitlines()
        assert any(line.startswith("executions:") for line in lines)  # progress
        assert "secret(s) sealed again with the first key" in lines[-1]
        again = io.StringIO()
        call_command("reactor_rotate_keys", "--json", stdout=again)
        assert json.loads(again.getvalue())["rotated"] == 0  # nothing left to do
    with keys(NEW_KEY):  # the old key is gone
        for payload in tokens(paused.execution_id):
            Fernet(NEW_KEY).decrypt(payload["token"].encode())
            with pytest.raises(InvalidToken):
                Fernet(OLD_KEY).decrypt(payload["token"].encode())
        services.resume_interrupt(
            paused.execution_id, step="approval", payload={"approved": True, "pin": PIN}
        )
        finished = services.resume(paused.execution_id)
        assert isinstance(finished, Completed)
        assert received[-1] == ("confirm", (API_KEY, PIN))


def test_a_removed_key_parks_the_run_saying_which_key_to_put_back() -> None:
    with keys(OLD_KEY):
        paused = checkout(CheckoutInBackground)
    with keys(NEW_KEY):
        services.resume_interrupt(
            paused.execution_id, step="approval", payload={"approved": True, "pin": PIN}
        )
        parked = services.resume(paused.execution_id)
    assert isinstance(parked, Failed)
    assert parked.status == ExecutionStatus.NEEDS_ATTENTION
    assert "cannot be decrypted with any key" in parked.error.message
    assert "Put that key back" in parked.error.message


def test_rotation_while_runs_run_loses_nothing() -> None:
    runners, rounds = 3, 4
    with keys(OLD_KEY):
        waiting = [checkout().execution_id for _ in range(runners * 2)]
    started: list[uuid.UUID] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(runners + 1, timeout=60)

    def runner(index: int) -> None:
        try:
            barrier.wait()
            for number in range(rounds):
                outcome = Quick.run({"card": f"{CARD}-{index}-{number}"})
                assert isinstance(outcome, Completed), outcome
                with _received_lock:
                    started.append(outcome.execution_id)
            for execution_id in waiting[index * 2 : index * 2 + 2]:
                done = services.resume_interrupt(
                    execution_id, step="approval", payload={"approved": True, "pin": PIN}
                )
                assert isinstance(done, Completed), done
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    with keys(NEW_KEY, OLD_KEY):
        threads = [threading.Thread(target=runner, args=(i,)) for i in range(runners)]
        for thread in threads:
            thread.start()
        barrier.wait()
        out = io.StringIO()
        call_command("reactor_rotate_keys", "--batch-size", "1", "--json", stdout=out)
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        call_command("reactor_rotate_keys", stdout=io.StringIO())  # what started after it
    with keys(NEW_KEY):
        for execution_id in [*waiting, *started]:
            assert Execution.objects.get(pk=execution_id).status == ExecutionStatus.COMPLETED
            found = tokens(execution_id)
            assert found
            for payload in found:
                Fernet(NEW_KEY).decrypt(payload["token"].encode())
        assert len(started) == runners * rounds
        cards = {value for name, value in received if name == "token"}
        assert cards == {f"{CARD}-{i}-{n}" for i in range(runners) for n in range(rounds)}
        confirms = [value for name, value in received if name == "confirm"]
        assert confirms == [(API_KEY, PIN)] * len(waiting)


@pytest.fixture
def forgotten_runs() -> dict[str, uuid.UUID]:
    """A paused run of customer c-1 and one of c-2; c-1 forgotten."""
    runs = {
        "paused": checkout(CustomerCheckout, customer_id="c-1").execution_id,
        "other": checkout(CustomerCheckout, customer_id="c-2").execution_id,
    }
    out = io.StringIO()
    call_command("reactor_forget_subject", "c-1", stdout=out)
    assert "subject 'c-1' forgotten" in out.getvalue()
    assert "1 run(s)" in out.getvalue()
    return runs


def test_a_subjects_secrets_are_sealed_with_its_own_key() -> None:
    paused = checkout(CustomerCheckout, customer_id="c-9")
    found = tokens(paused.execution_id)
    key = SubjectKey.objects.get(subject="c-9")
    assert {payload["key"] for payload in found} == {str(key.pk)}
    assert CARD not in raw_rows(paused.execution_id)
    with connection.cursor() as cursor:  # the data key is stored encrypted with the keyring
        key_column = connection.ops.quote_name("key")  # a reserved word on MariaDB
        cursor.execute(f"SELECT {key_column} FROM django_reactor_subjectkey WHERE subject = 'c-9'")
        (wrapped,) = cursor.fetchone()
    data_key = Fernet(store.keyring.decrypt(wrapped))
    assert json.loads(data_key.decrypt(found[0]["token"].encode())) == CARD
    assert Execution.objects.get(pk=paused.execution_id).subject == "c-9"


def test_a_forgotten_subjects_runs_display_their_secrets_as_erased(
    forgotten_runs: dict[str, uuid.UUID], client: Client
) -> None:
    run_id = forgotten_runs["paused"]
    handle = CustomerCheckout.find(run_id)
    assert handle.inputs == {"email": "ada@example.com", "card": ERASED, "customer_id": "c-1"}
    assert handle.step("charge").arguments["card"] == ERASED
    assert handle.step("charge").result["api_key"] == ERASED
    assert handle.step("charge").result["charge_id"] == 7
    # Another subject's secrets are only redacted.
    assert CustomerCheckout.find(forgotten_runs["other"]).inputs["card"] == REDACTED

    out = io.StringIO()
    call_command("reactor_show", str(run_id), stdout=out)
    assert "subject: c-1" in out.getvalue()
    assert ERASED in out.getvalue()

    api = APIClient()
    api.force_authenticate(User.objects.create_superuser("api", "api@example.com", "pw"))
    body = api.get(f"/reactor/executions/{run_id}/").json()
    assert body["inputs"]["card"] == ERASED
    assert {s["name"]: s for s in body["steps"]}["charge"]["result"]["api_key"] == ERASED

    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    page = client.get(reverse("admin:django_reactor_execution_change", args=[str(run_id)]))
    assert page.status_code == 200
    assert ERASED in page.content.decode()

    again = io.StringIO()
    call_command("reactor_forget_subject", "c-1", stdout=again)
    assert "forgotten already" in again.getvalue()


def test_a_run_that_needs_an_erased_secret_fails_saying_so(
    forgotten_runs: dict[str, uuid.UUID],
) -> None:
    outcome = services.resume_interrupt(
        forgotten_runs["paused"], step="approval", payload={"approved": True, "pin": PIN}
    )
    assert isinstance(outcome, Failed)
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.kind == "subject_erased"
    assert "the secrets of subject 'c-1' were erased" in outcome.error.message
    assert not outcome.error.traceback
    handle = CustomerCheckout.find(forgotten_runs["paused"])
    assert handle.status == ExecutionStatus.FAILED
    assert [e.kind for e in handle.trace][-1] == "fail"
    assert handle.trace[-1].data["kind"] == "subject_erased"
    assert received == [("charge", CARD)] * 2  # the confirm step never ran

    # Retrying it, or undoing it, is refused with the same plain reason.
    with pytest.raises(SubjectErased, match="were erased"):
        services.retry(forgotten_runs["paused"])

    # The other subject goes on.
    done = services.resume_interrupt(
        forgotten_runs["other"], step="approval", payload={"approved": True, "pin": PIN}
    )
    assert isinstance(done, Completed)


def test_a_worker_fails_a_run_of_a_forgotten_subject_without_a_traceback() -> None:
    paused = checkout(CustomerCheckoutInBackground, customer_id="c-7")
    services.resume_interrupt(
        paused.execution_id, step="approval", payload={"approved": True, "pin": PIN}
    )
    services.forget_subject("c-7")  # after the payload came, before a worker took the run
    finished = services.resume(paused.execution_id)  # what the worker's task does
    assert isinstance(finished, Failed)
    assert finished.error.kind == "subject_erased"
    assert "the secrets of subject 'c-7' were erased" in finished.error.message
    assert "nothing was rolled back" in finished.error.message
    assert not finished.error.traceback
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.FAILED
    assert ("confirm", (API_KEY, PIN)) not in received
    # It still displays, its secrets erased.
    handle = CustomerCheckoutInBackground.find(paused.execution_id)
    assert handle.step("approval").result == {"approved": True, "pin": ERASED}
