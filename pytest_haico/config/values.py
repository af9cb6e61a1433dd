"""The option values' parsers: each turns a raw value (from the command line, the
environment or an ini file) into its type, or refuses it with a `ConfigError` naming the
source, the bad value and what is valid."""

from __future__ import annotations

import enum
import shlex
import urllib.parse
from collections.abc import Callable
from typing import Any

from pytest_haico.errors import ConfigError

# The already-served model's API key (--haico-model-endpoint): from the environment only,
# since argv and ini files are readable by others.
MODEL_API_KEY_ENV = "HAICO_MODEL_API_KEY"


def parse_results_mode(value: Any, source: str) -> int:
    """An octal file mode (`0640`, `644`, `0o600`) with r/w bits only, that the owner can read
    and write and nobody else can write."""
    text = str(value).strip()
    digits = text.removeprefix("0o").removeprefix("0O") or "0"
    problem = None
    try:
        mode = int(digits, 8)
    except ValueError:
        mode, problem = 0, "not an octal number"
    if problem is None:
        if mode & ~0o666:
            problem = "a file mode has r and w bits only (no x, setuid, setgid or sticky bit)"
        elif mode & 0o022:
            problem = "group or others could write, and so change the ledger"
        elif mode & 0o600 != 0o600:
            problem = "the owner must be able to read and write"
    if problem is not None:
        raise ConfigError(
            source,
            "",
            f"invalid results mode {text!r}: {problem}; give an octal file mode such as 0640 "
            "(the default: the group may read) or 0644 (everyone may read)",
        )
    return mode


def parse_bool(value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(source, "", f"expected a boolean (1/0, true/false), got {value!r}")


def int_parser(*, minimum: int) -> Callable[[Any, str], int]:
    def parse(value: Any, source: str) -> int:
        try:
            number = int(str(value).strip())
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise ConfigError(source, "", f"expected an integer >= {minimum}, got {value!r}")
        return number

    return parse


def float_parser(*, minimum: float) -> Callable[[Any, str], float]:
    def parse(value: Any, source: str) -> float:
        try:
            number = float(str(value).strip())
        except ValueError:
            number = minimum - 1
        if not number >= minimum:
            raise ConfigError(
                source, "", f"expected a number of seconds >= {minimum:g}, got {value!r}"
            )
        return number

    return parse


def enum_parser(kind: type[enum.StrEnum]) -> Callable[[Any, str], Any]:
    def parse(value: Any, source: str) -> Any:
        try:
            return kind(str(value).strip())
        except ValueError:
            valid = ", ".join(member.value for member in kind)
            raise ConfigError(source, "", f"invalid value {value!r}; valid: {valid}") from None

    return parse


def parse_command(value: Any, source: str) -> str:
    """A command line as a shell would split it (it runs without a shell)."""
    text = parse_text(value, source)
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(source, "", f"cannot split {text!r}: {exc}") from None
    if not words:
        raise ConfigError(source, "", "must name a program")
    return text


def parse_endpoint(value: Any, source: str) -> str:
    """An OpenAI-compatible base URL: http(s), a host, a port, no credentials or query."""
    text = parse_text(value, source).rstrip("/")
    url = urllib.parse.urlsplit(text)
    problem = None
    if url.scheme not in ("http", "https"):
        problem = "use http:// or https://"
    elif not url.hostname:
        problem = "it names no host"
    elif url.username or url.password:
        problem = f"no credentials in the URL: the key goes in ${MODEL_API_KEY_ENV}"
    elif url.query or url.fragment:
        problem = "no query or fragment"
    if problem is not None:
        raise ConfigError(
            source,
            "",
            f"{text!r} is not a model server's base URL ({problem}); "
            "e.g. http://vllm.localhost:8000/v1",
        )
    return text


def parse_text(value: Any, source: str) -> str:
    text = str(value).strip()
    if not text:
        raise ConfigError(source, "", "must not be empty")
    return text


def parse_name(value: Any, source: str) -> str:
    text = str(value).strip()
    if not text or "/" in text or text.startswith("."):
        raise ConfigError(source, "", f"invalid name {value!r}; use a plain directory name")
    return text


def parse_names(value: Any, source: str) -> list[str]:
    names = [str(part).strip() for part in value]
    if not all(names):
        raise ConfigError(source, "", f"empty name in {value!r}")
    return names
