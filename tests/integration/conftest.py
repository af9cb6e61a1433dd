"""Fixtures and set-up shared by the integration tests."""

from __future__ import annotations

# httpx imports httpcore on first use and keeps a map of the httpcore exception classes it
# met first. pytester restores sys.modules after each test: if httpcore were first imported
# inside such a test, a later test would get a second copy whose errors (a backend killed
# mid-stream) escape httpx unmapped. Importing it here, at collection, keeps one copy.
import httpcore  # noqa: F401
