"""Arguments the stand-in model generates satisfy a tool's JSON schema; broken ones fail it."""

from __future__ import annotations

import random
from datetime import date, datetime
from enum import StrEnum
from typing import Any, Literal
from uuid import UUID

import pytest
from pydantic import BaseModel, Field, ValidationError

from pytest_haico.standins.agent import WriteDocumentArgs
from pytest_haico.standins.schema_values import break_arguments, generate_value


class Priority(StrEnum):
    LOW = "low"
    HIGH = "high"


class Address(BaseModel):
    street: str = Field(min_length=30, max_length=40)
    zip_code: str = Field(pattern=r"^[0-9]{5}$")
    country: str = Field(pattern=r"^(?:[A-Z]{2}|[A-Z]{3})$")


class Order(BaseModel):
    action_and_reasoning: str
    quantity: int = Field(ge=3, le=7)
    price: float = Field(gt=0, lt=1)
    discount: int = Field(multiple_of=5, ge=12, le=40)
    priority: Priority
    mode: Literal["fast", "slow"]
    tags: list[str] = Field(min_length=2, max_length=3)
    address: Address
    alternative: Address | None = None
    when: datetime
    day: date
    ident: UUID
    flags: dict[str, bool] = {}
    pair: tuple[int, str]
    count_or_name: int | str
    nested: list[Address] = Field(min_length=1)


class AllOptional(BaseModel):
    size: int = 1
    label: str = "x"


SCHEMA_MODELS = [WriteDocumentArgs, Order, Address, AllOptional]


@pytest.mark.parametrize("model", SCHEMA_MODELS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("seed", range(5))
def test_generated_arguments_validate_against_pydantic_schemas(
    model: type[BaseModel], seed: int
) -> None:
    value = generate_value(model.model_json_schema(), rng=random.Random(seed), topic="a trip")
    model.model_validate(value)


def test_generated_arguments_are_deterministic_for_one_seed() -> None:
    schema = Order.model_json_schema()
    first = generate_value(schema, rng=random.Random(7), topic="t")
    assert generate_value(schema, rng=random.Random(7), topic="t") == first


def test_generated_strings_carry_the_topic() -> None:
    value = generate_value(
        WriteDocumentArgs.model_json_schema(), rng=random.Random(0), topic="Crete in May"
    )
    assert "Crete in May" in value["content"]


@pytest.mark.parametrize(
    ("schema", "check"),
    [
        ({"type": ["string", "null"], "minLength": 5}, lambda v: len(v) >= 5),
        ({"const": 42}, lambda v: v == 42),
        ({"enum": ["a"]}, lambda v: v == "a"),
        (
            {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"required": ["b"]}]},
            lambda v: isinstance(v["a"], int) and isinstance(v["b"], str),
        ),
        (
            {
                "definitions": {"Leaf": {"type": "boolean"}},
                "type": "object",
                "properties": {"leaf": {"$ref": "#/definitions/Leaf"}},
                "required": ["leaf"],
            },
            lambda v: isinstance(v["leaf"], bool),
        ),
        ({"type": "array", "maxItems": 0}, lambda v: v == []),
        ({"pattern": "^(fast|slow)$"}, lambda v: v in ("fast", "slow")),
        ({"pattern": r"^[A-Z]{2}-\d{3,}$", "minLength": 8}, lambda v: len(v) >= 8),
        ({"type": "number", "exclusiveMaximum": -5}, lambda v: v < -5),
        ({}, lambda v: isinstance(v, str)),
    ],
    ids=[
        "nullable-min-length",
        "const",
        "enum",
        "all-of",
        "ref",
        "empty",
        "pattern-alternation",
        "pattern-with-min-length",
        "max",
        "any",
    ],
)
def test_hand_written_schema_keywords_are_honoured(schema: dict[str, Any], check: Any) -> None:
    assert check(generate_value(schema, rng=random.Random(1), topic="t"))


def test_broken_arguments_lose_the_required_reasoning() -> None:
    schema = WriteDocumentArgs.model_json_schema()
    valid = generate_value(schema, rng=random.Random(0), topic="t")
    broken = break_arguments(schema, valid)
    assert "action_and_reasoning" not in broken
    assert broken["title"] == valid["title"]
    with pytest.raises(ValidationError, match="action_and_reasoning"):
        WriteDocumentArgs.model_validate(broken)


@pytest.mark.parametrize("model", SCHEMA_MODELS, ids=lambda m: m.__name__)
def test_broken_arguments_fail_validation(model: type[BaseModel]) -> None:
    schema = model.model_json_schema()
    broken = break_arguments(schema, generate_value(schema, rng=random.Random(0), topic="t"))
    with pytest.raises(ValidationError):
        model.model_validate(broken)
