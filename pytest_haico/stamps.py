"""UTC time stamps, from one owner, in two forms and never in local time:

* `utc_iso`: in a file's text and in messages (a submission's journal, catalogue entries,
  locks, claims, a kept stack's state, a service log's header), ISO 8601 to the second,
  e.g. `2026-12-07T01:18:18+00:00`, as a record's `started_at` is to the microsecond;
  `datetime.fromisoformat` reads it back.
* `utc_name`: in a file or directory name (run ids, dumps, logs, plans), the same without
  separators, e.g. `20261207T011818Z`: it sorts as text and needs no quoting.
* `utc_shown`: for a person reading a report, `2026-12-07 01:18:18 UTC`.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime


def utc_iso(at: float | datetime | None = None) -> str:
    """`at` (seconds since the epoch, or an aware datetime; default now) as ISO 8601 UTC to
    the second. A naive datetime is refused: its zone is unknown."""
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise ValueError(f"{at} has no time zone")
        moment = at.astimezone(UTC)
    else:
        moment = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    return moment.isoformat(timespec="seconds")


def utc_name(at: float | None = None) -> str:
    """`at` (seconds since the epoch; default now) as a UTC stamp for a file's name."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(at))


def utc_shown(moment: datetime) -> str:
    """An aware `moment` for a person: `2026-12-07 01:18:18 UTC`."""
    if moment.tzinfo is None:
        raise ValueError(f"{moment} has no time zone")
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
