"""What a scripted turn may expect (`expect:`): the vocabulary, validated at load."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from pytest_haico.config.bounds import not_blank
from pytest_haico.config.limits import MAX_NAME_CHARS, MAX_RECURSION_LIMIT, MAX_TURN_CHARS


def check_regular_expression(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(
            f"not a valid regular expression ({exc}); write Python `re` syntax, and escape "
            "a character meant literally with a backslash (\\( for '(')"
        ) from None
    return value


Needle = Annotated[str, Field(min_length=1, max_length=MAX_TURN_CHARS), AfterValidator(not_blank)]
Pattern = Annotated[str, Field(min_length=1), AfterValidator(check_regular_expression)]
ToolName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), AfterValidator(not_blank)]


class Expect(BaseModel):
    """What a turn must produce: every key set is checked on the turn, none is required.

    The answer is the text of the turn's final step. Keys a script does not set stay out
    of the item's identity, so adding a key here keeps every existing item_id.
    """

    # The docstrings under the fields are read by the reference (`config.reference`), not
    # at import: pydantic's use_attribute_docstrings reads each model's source at every start.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    artifact: bool | None = None
    """true: a step produced an artifact; false asks for nothing."""
    contains: Needle | Annotated[list[Needle], Field(min_length=1)] | None = None
    """A string, or a list of strings, each of which the answer contains."""
    matches: Pattern | None = None
    """A Python regular expression `re.search` finds in the answer."""
    tool_called: ToolName | None = None
    """A tool some step called."""
    tool_not_called: ToolName | None = None
    """A tool no step called."""
    no_tool_error: bool | None = None
    """true: no tool call failed."""
    max_steps: Annotated[int, Field(ge=1, le=MAX_RECURSION_LIMIT)] | None = None
    """The most steps the turn may take."""
    # Through the hook pytest_haico_judge_turn. Which judge answers is not the item's identity.
    judge: Needle | None = None
    """A yes/no question about the answer, put to the judge model (`--haico-judge`,
    `[run] judge`); it passes on yes."""

    @field_validator("contains", mode="before")
    @classmethod
    def _text_or_texts(cls, value: Any) -> Any:
        # One message for both shapes, instead of the first of the union's errors.
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise ValueError("must be a string or a non-empty list of strings")
        if not all(v.strip() for v in value):
            raise ValueError("must not hold an empty or blank string")
        return value

    # `matches`, compiled once at load (validation has proved it compiles).
    _pattern: re.Pattern[str] | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        if self.matches is not None:
            self._pattern = re.compile(self.matches)

    @property
    def pattern(self) -> re.Pattern[str] | None:
        """`matches` as a compiled regular expression (searched for in the answer)."""
        return self._pattern

    @property
    def needles(self) -> tuple[str, ...]:
        """The strings `contains` asks for, each of which the answer must contain."""
        if self.contains is None:
            return ()
        return (self.contains,) if isinstance(self.contains, str) else tuple(self.contains)
