"""The redaction filter every transcript line and error message passes before it is written."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import partial
from typing import Any

PLACEHOLDER = "[REDACTED]"

# Patterns that carry a secret whatever its value: an HTTP bearer credential (the
# token's charset per RFC 6750), the password of a URL-style DSN and of a libpq
# key=value DSN. psycopg and httpx errors can quote a DSN or a header verbatim.
_PATTERNS = (
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9\-._~+/]+=*"), rf"\g<1>{PLACEHOLDER}"),
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@\s]+@"), rf"\g<1>{PLACEHOLDER}@"),
    (re.compile(r"(?i)\b(password\s*=\s*)('[^']*'|\S+)"), rf"\g<1>{PLACEHOLDER}"),
)
# Text without these cannot match a pattern: "bearer" and "password" in their
# case-folded form (folding covers what re's IGNORECASE matches, U+017F "ſ" for
# "s" included), or "://" together with "@". A plain search is ~10x cheaper
# than an IGNORECASE regex scan.
_FOLDED_WORDS = ("bearer", "password")

_dumps = partial(json.dumps, ensure_ascii=False, separators=(",", ":"), default=str)


class Redactor:
    """Replaces known secret values and credential-shaped text with a placeholder."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))
        # How each secret looks inside a JSON string (escaping is per character,
        # so a secret in a string is its escaped form in the JSON text).
        self._escaped = tuple({_dumps(s)[1:-1] for s in self._secrets})

    def with_secrets(self, *secrets: str) -> Redactor:
        """A redactor that also knows ``secrets``."""
        return Redactor((*self._secrets, *secrets))

    def redact(self, text: str) -> str:
        """``text`` with every known secret and credential pattern replaced."""
        if not self._may_hold_secret(text, self._secrets):
            return text
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, PLACEHOLDER)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text

    def redact_json(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string (keys too) redacted.

        Redacting before serialisation catches secrets that JSON would escape
        (a quote or backslash in a value), which a pass over the line would miss.
        Other objects become their redacted ``str()``, as `dumps` would write them.
        """
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {
                self.redact(k) if isinstance(k, str) else k: self.redact_json(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.redact_json(item) for item in value]
        if value is None or isinstance(value, int | float):
            return value
        return self.redact(str(value))

    def dumps(self, value: Any) -> str:
        """A JSON-like value as one compact JSON text, every string in it redacted.

        The text is encoded once and searched as a whole; only when something
        in it could be a secret are the strings redacted one by one (`redact_json`)
        and the value encoded again. Objects JSON does not know are written as
        their ``str()``.
        """
        text = _dumps(value)
        if self._may_hold_secret(text, self._escaped):
            text = _dumps(self.redact_json(value))
        return text

    @staticmethod
    def _may_hold_secret(text: str, secrets: tuple[str, ...]) -> bool:
        """False only when no secret and no credential pattern can be in ``text``."""
        if "@" in text and "://" in text:
            return True
        if any(secret in text for secret in secrets):
            return True
        folded = text.casefold()
        return any(word in folded for word in _FOLDED_WORDS)
