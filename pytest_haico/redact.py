"""The redaction filter every transcript line and error message passes before it is written."""

from __future__ import annotations

import re
from collections.abc import Iterable
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


class Redactor:
    """Replaces known secret values and credential-shaped text with a placeholder."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))

    def with_secrets(self, *secrets: str) -> Redactor:
        """A redactor that also knows ``secrets``."""
        return Redactor((*self._secrets, *secrets))

    def redact(self, text: str) -> str:
        """``text`` with every known secret and credential pattern replaced."""
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
        return value
