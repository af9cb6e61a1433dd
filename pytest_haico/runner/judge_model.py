"""pytest-haico's own implementation of the hook `pytest_haico_judge_turn`: it asks the judge
model, over OpenAI chat completions at its catalogue endpoint with its key, whether the turn's
answer passes the question, and reads yes or no from the first word of its answer.

A judge that cannot be reached, answers an error, or answers neither yes nor no is asked
again (`ATTEMPTS` in all); then it is a `JudgeError`, which makes the attempt infra."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest

from pytest_haico import httpclient
from pytest_haico.driver.judging import JudgedTurn, JudgeVerdict
from pytest_haico.errors import CatalogueError, JudgeError
from pytest_haico.serve.resolver import ServedModel

JUDGE_PLUGIN = "haico-judge"
ATTEMPTS = 3
RETRY_PAUSE_S = 0.5  # times the attempt's number
TIMEOUT_S = 120.0
_MAX_TOKENS = 16
_SHOWN_CHARS = 200
SYSTEM_PROMPT = (
    "You judge one answer of an assistant. Read the question, what the user wrote and what "
    "the assistant answered; then answer the question with one word: yes or no."
)
# The first word, after white space, quotes, emphasis or an opening bracket.
_VERDICT = re.compile(r"[\s*\"'`(\[]*(yes|no)\b", re.IGNORECASE)


class JudgeModelPlugin:
    """The default judge (registered as "haico-judge"): runs after every other implementation,
    so a project's `conftest.py` answers first (or returns None to leave a turn to it)."""

    @pytest.hookimpl(trylast=True)
    def pytest_haico_judge_turn(self, turn: JudgedTurn, judge: ServedModel) -> JudgeVerdict:
        return ask_judge(turn, judge)


def judge_messages(turn: JudgedTurn) -> list[dict[str, str]]:
    """The chat the judge model is sent: the instruction, then the question on the first line
    of the user message and the answer as its last paragraph."""
    text = (
        f"{turn.question}\n\nThe user wrote:\n{turn.user}\n\nThe assistant answered:\n{turn.answer}"
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]


def parse_verdict(text: str) -> bool | None:
    """Yes (True) or no (False) from the answer's first word, any case and punctuation; None
    for any other answer."""
    found = _VERDICT.match(text)
    return None if found is None else found.group(1).lower() == "yes"


def ask_judge(
    turn: JudgedTurn, judge: ServedModel, *, attempts: int = ATTEMPTS, timeout_s: float = TIMEOUT_S
) -> JudgeVerdict:
    """The judge model's verdict on `turn`; a `JudgeError` saying why after `attempts`."""
    try:
        key = judge.api_key()
    except CatalogueError as exc:
        raise JudgeError(str(exc)) from None
    body = {
        "model": judge.served_name,
        "messages": judge_messages(turn),
        "max_tokens": _MAX_TOKENS,
        "temperature": 0.0,
    }
    url = f"{judge.endpoint}/chat/completions"
    problem = "not asked"
    with httpclient.client(timeout=timeout_s) as client:
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                time.sleep(RETRY_PAUSE_S * (attempt - 1))
            try:
                response = client.post(url, json=body, headers={"Authorization": f"Bearer {key}"})
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            if not response.is_success:
                problem = f"HTTP {response.status_code}: {response.text[:_SHOWN_CHARS].strip()}"
                continue
            text = _content(response)
            if text is None:
                problem = f"not a chat completion: {response.text[:_SHOWN_CHARS]!r}"
                continue
            verdict = parse_verdict(text)
            if verdict is not None:
                return JudgeVerdict(passed=verdict, answer=text)
            problem = f"answered {text[:_SHOWN_CHARS]!r}, neither yes nor no"
    raise JudgeError(
        f"judge {judge.name!r} at {url} (job {judge.entry.job.id}), {attempts} attempts: {problem}"
    )


def _content(response: httpx.Response) -> str | None:
    """The first choice's message content, or None when the body is not a chat completion."""
    try:
        document: Any = response.json()
        content = document["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else ("" if content is None else None)
