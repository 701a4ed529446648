"""Signed webhooks interoperate with the Standard Webhooks spec: the spec's test vector, and
both directions against the maintained ``standardwebhooks`` package (a sender that signs with
it is verified by django_reactor; a delivery django_reactor signs verifies with it)."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from django_reactor.api import signatures

# The example of the spec's reference libraries (standard-webhooks, "sign" tests).
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = 1614265330
PAYLOAD = b'{"test": 2432232314}'
EXPECTED = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


@pytest.fixture(autouse=True)
def _secret(settings: Any) -> None:
    settings.REACTOR = {**getattr(settings, "REACTOR", {}), "WEBHOOK_SECRETS": SECRET}


def test_the_spec_vector_signs_and_verifies() -> None:
    headers = signatures.sign(SECRET, MSG_ID, PAYLOAD, timestamp=TIMESTAMP)
    assert headers == {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(TIMESTAMP),
        "webhook-signature": EXPECTED,
    }
    verified = signatures.verify(headers, PAYLOAD, now=TIMESTAMP + 10)
    assert verified.webhook_id == MSG_ID


def test_a_delivery_signed_by_the_standardwebhooks_package_is_verified() -> None:
    body = json.dumps({"step": "approval", "payload": {"approved": True}}).encode()
    now = int(time.time())
    value = Webhook(SECRET).sign(MSG_ID, dt.datetime.fromtimestamp(now, tz=dt.UTC), body.decode())
    headers = {"webhook-id": MSG_ID, "webhook-timestamp": str(now), "webhook-signature": value}
    assert signatures.verify(headers, body).webhook_id == MSG_ID
    # A rotating sender sends several signatures; one that verifies is enough.
    headers["webhook-signature"] = f"v1,{'A' * 44} {value}"
    assert signatures.verify(headers, body).webhook_id == MSG_ID
    with pytest.raises(signatures.SignatureError):
        signatures.verify(headers, body + b" ")


def test_a_delivery_django_reactor_signs_verifies_with_the_standardwebhooks_package() -> None:
    body = b'{"payload": {"approved": true}}'
    headers = signatures.sign(SECRET, "msg_2", body)
    assert Webhook(SECRET).verify(body, headers) == {"payload": {"approved": True}}
    headers["webhook-signature"] = "v1," + "B" * 44
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body, headers)
