"""The redaction filter."""

from __future__ import annotations

import json

import pytest

from pytest_haico.redact import PLACEHOLDER, Redactor


def test_known_secrets_are_replaced_longest_first() -> None:
    redactor = Redactor(["abc123", "abc123xyz", ""])
    assert redactor.redact("k=abc123xyz and abc123.") == f"k={PLACEHOLDER} and {PLACEHOLDER}."


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer eyJhbGciOi.J9-x_y~z+/==", f"Authorization: Bearer {PLACEHOLDER}"),
        ("bearer   s3cr3t rest", f"bearer   {PLACEHOLDER} rest"),
        (
            "postgresql://haico:pw%40x@127.0.0.1:5432/db",
            f"postgresql://haico:{PLACEHOLDER}@127.0.0.1:5432/db",
        ),
        ("host=/tmp password='a b' dbname=x", f"host=/tmp password={PLACEHOLDER} dbname=x"),
        ("http://vllm.localhost:8000/v1", "http://vllm.localhost:8000/v1"),
    ],
)
def test_credential_shapes_are_redacted_without_knowing_the_value(text: str, expected: str) -> None:
    assert Redactor().redact(text) == expected


def test_with_secrets_adds_without_changing_the_original() -> None:
    base = Redactor(["one-secret"])
    more = base.with_secrets("two-secret")
    assert more.redact("one-secret two-secret") == f"{PLACEHOLDER} {PLACEHOLDER}"
    assert base.redact("two-secret") == "two-secret"


def test_json_values_and_keys_are_redacted_before_escaping() -> None:
    secret = 'q"uo\\te'
    value = {"a": [secret, {secret: 1}], "n": 3, "b": None}
    redacted = Redactor([secret]).redact_json(value)
    assert redacted == {"a": [PLACEHOLDER, {PLACEHOLDER: 1}], "n": 3, "b": None}
    assert secret not in json.dumps(redacted) and json.dumps(secret)[1:-1] not in json.dumps(
        redacted
    )
