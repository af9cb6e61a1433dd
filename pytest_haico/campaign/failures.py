"""A haico item's failure in a few lines: the conversation's explanation (which turn, which
verdict, why) once, and where its transcript is; an infrastructure error without the source
of the fixture that raised it. A user's own assertion is left as pytest shows it, and so is
everything under --tb=long, --tb=native or --full-trace (pytest's whole traceback)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from pytest_haico.errors import InfraError, LedgerWriteError, StackError, headline
from pytest_haico.files import shown_path

# The styles in which a haico failure is its explanation; the others are pytest's own.
COMPACT_STYLES = ("auto", "short", "line", "no")


class _Writer(Protocol):
    def line(self, s: str = "", **markup: bool) -> None: ...


@dataclass(frozen=True)
class Crash:
    """What pytest's short summary and --tb=line show of a failure (its `reprcrash`)."""

    path: str
    lineno: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.lineno}: {self.message}"


@dataclass(frozen=True)
class CompactFailure:
    """A failure's report as a few lines (pytest's `longrepr`); the first is its headline."""

    lines: tuple[str, ...]
    reprcrash: Crash

    def toterminal(self, tw: _Writer) -> None:
        for index, line in enumerate(self.lines):
            if index == 0:
                tw.line(line, red=True, bold=True)
            else:
                tw.line(line)

    def __str__(self) -> str:
        return "\n".join(self.lines)


def compact_failure(
    item: pytest.Item,
    call: pytest.CallInfo[None],
    report: pytest.TestReport,
    *,
    verdict: str | None,
    transcript: Path | None,
) -> None:
    """Replace a failed haico item's report with its explanation, when the failure is
    haico's own: the assertion on the conversation's `explain()`, or an infrastructure or
    stack error. `verdict` is the item's recorded one (the short summary's word)."""
    config = item.config
    if not report.failed or call.excinfo is None or config.option.fulltrace:
        return
    if config.option.tbstyle not in COMPACT_STYLES:
        return
    explanation = _explanation(item, call.excinfo)
    if explanation is None:
        return
    lines = explanation.splitlines() or [explanation]
    if transcript is not None and transcript.is_file():
        shown = shown_path(transcript, config.invocation_params.dir)
        if shown not in explanation and str(transcript) not in explanation:
            lines.append(f"transcript: {shown}")
    path, lineno = item.location[0], (item.location[1] or 0) + 1
    # --tb=line shows the headline. The short summary's word carries the verdict (see
    # `with_verdict`: pytest cuts the message to the terminal's width, never the word), and
    # its message says no more than how far the conversation got: the reason is above, once.
    headline = lines[0]
    if config.option.tbstyle != "line":
        headline = _how_far(headline, verdict) or call.excinfo.typename
    report.longrepr = CompactFailure(tuple(lines), Crash(path, lineno, headline))  # type: ignore[assignment]


def with_verdict(status: object, verdict: str) -> object:
    """pytest's test status (category, letter, word) with the verdict after the word:
    `FAILED recursion_limit` in the short summary and under -v. A blank word (pytest prints
    nothing for the test) stays blank."""
    if not (isinstance(status, tuple) and len(status) == 3):
        return status
    category, letter, word = status
    if isinstance(word, tuple) and len(word) == 2 and isinstance(word[0], str) and word[0]:
        return category, letter, (f"{word[0]} {verdict}", word[1])
    if isinstance(word, str) and word:
        return category, letter, f"{word} {verdict}"
    return status


def _how_far(headline: str, verdict: str | None) -> str | None:
    """`after 2 turn(s)` from an explanation's headline, when it is the verdict's."""
    if verdict is None:
        return None
    found = re.search(rf"(?:^|: ){re.escape(verdict)} (after \d+ turn\(s\))", headline)
    return found[1] if found else None


def _explanation(item: pytest.Item, excinfo: pytest.ExceptionInfo[BaseException]) -> str | None:
    """The failure's explanation when it is haico's own, else None (pytest's report stays)."""
    error = excinfo.value
    if isinstance(error, StackError):
        # The same message for every item of the arm; the haico summary shows it whole.
        return f"{excinfo.typename}: {headline(str(error))}"
    if isinstance(error, InfraError | LedgerWriteError):  # the error says what and why
        return f"{excinfo.typename}: {error}"
    if not isinstance(error, AssertionError | pytest.fail.Exception):
        return None
    conversation: Any = getattr(item, "funcargs", {}).get("haico_conversation")
    explain = getattr(conversation, "explain", None)
    if explain is None:
        return None
    explanation = str(explain())
    if not _starts_with(str(error), explanation):
        return None  # the user's own assertion (or message): pytest shows it
    return explanation


def _starts_with(message: str, explanation: str) -> bool:
    """Whether an assertion's message is the explanation (pytest's assertion rewriting
    re-indents the lines of a message and appends its own)."""
    wanted = [line.strip() for line in explanation.splitlines()]
    got = [line.strip() for line in message.splitlines()]
    return bool(wanted) and got[: len(wanted)] == wanted
