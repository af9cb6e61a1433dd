"""UTC stamps, in a file's text and in a file's name: UTC whatever the host's time zone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import pytest

from pytest_haico.stamps import utc_iso, utc_name, utc_shown

AT = 1_765_000_000.75  # 2025-12-06T05:46:40.75 UTC


@pytest.fixture
def in_tokyo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_a_stamp_in_text_is_iso_8601_utc_to_the_second(in_tokyo: None) -> None:
    assert utc_iso(AT) == "2025-12-06T05:46:40+00:00"
    assert datetime.fromisoformat(utc_iso(AT)) == datetime(2025, 12, 6, 5, 46, 40, tzinfo=UTC)
    tokyo = timezone(timedelta(hours=9))
    assert utc_iso(datetime(2025, 12, 6, 14, 46, 40, tzinfo=tokyo)) == utc_iso(AT)


def test_a_stamp_in_a_name_is_utc_without_separators(in_tokyo: None) -> None:
    assert utc_name(AT) == "20251206T054640Z"


def test_a_time_without_a_zone_is_refused() -> None:
    with pytest.raises(ValueError, match="has no time zone"):
        utc_iso(datetime(2025, 12, 6, 5, 46, 40))


def test_a_stamp_for_a_person_says_utc(in_tokyo: None) -> None:
    tokyo = timezone(timedelta(hours=9))
    assert utc_shown(datetime(2025, 12, 6, 14, 46, 40, tzinfo=tokyo)) == "2025-12-06 05:46:40 UTC"
