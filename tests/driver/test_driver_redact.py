"""The redaction filter."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


class _Exhaustive(Redactor):
    """Runs every replacement over every string: what the pre-checks must never change."""

    @staticmethod
    def _may_hold_secret(text: str, secrets: tuple[str, ...]) -> bool:
        return True


def _redact_each_string(secrets: list[str], value: Any) -> str:
    """What `Redactor.dumps` must equal: every string redacted in full, then encoded."""
    return json.dumps(
        _Exhaustive(secrets).redact_json(value),
        ensure_ascii=False,
        separators=(",", ":"),
        default=str,
    )


SECRET = 'q"uo\\te-s3cr3t'


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({"kind": "event", "data": {"text": "plain", "n": [1, 2.5, None]}}, id="clean"),
        pytest.param({"a": [SECRET, {SECRET: 1}]}, id="secret-with-json-escapes"),
        pytest.param({"auth": "BEARER abc.def"}, id="bearer-any-case"),
        pytest.param({"h": "pasſword=hunter2"}, id="long-s-folds-to-s"),
        pytest.param({"password = 'x y'": "key"}, id="in-a-key"),
        pytest.param({"dsn": "postgresql://u:pw@h/db"}, id="url-password"),
        pytest.param({"url": "http://vllm.localhost:8000/v1", "mail": "a@b"}, id="url-and-at"),
        pytest.param(("tuple", "bearer tok"), id="tuple"),
        pytest.param({"at": datetime(2024, 1, 1, tzinfo=UTC)}, id="non-json-object"),
        pytest.param({"line": "tab\tbearer\ttok"}, id="escaped-whitespace"),
    ],
)
def test_dumps_equals_redacting_every_string(value: Any) -> None:
    text = Redactor([SECRET]).dumps(value)
    assert text == _redact_each_string([SECRET], value)
    assert SECRET not in text and json.dumps(SECRET)[1:-1] not in text


def test_objects_json_does_not_know_are_redacted_as_their_text() -> None:
    class Leaky:
        def __str__(self) -> str:
            return "Bearer abc"

    assert Redactor().dumps({"x": Leaky()}) == f'{{"x":"Bearer {PLACEHOLDER}"}}'


_PIECES = st.sampled_from(
    [
        "bearer ",
        "Bearer\t",
        "password=",
        "PASSWORD = ",
        "ſ",
        "pasſword=x",
        "http://",
        "u:p@",
        "@",
        "://",
        "s3cr3t",
        '"',
        "\\",
        "\n",
        "é",
        "abc",
        " ",
        "tok-1",
    ]
)
_TEXT = st.lists(_PIECES, max_size=6).map("".join)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(value=_VALUES)
def test_dumps_property_equals_redacting_every_string(value: Any) -> None:
    secrets = ["s3cr3t", 'a"b\\c']
    assert Redactor(secrets).dumps(value) == _redact_each_string(secrets, value)


@settings(max_examples=400, deadline=None)
@given(text=_TEXT)
def test_redact_property_equals_every_replacement(text: str) -> None:
    assert Redactor(["s3cr3t"]).redact(text) == _Exhaustive(["s3cr3t"]).redact(text)
