"""How many conversations an arm keeps in flight: a fixed number, or `auto` between 1 and the
arm's `max_concurrency`, from `--haico-concurrency` (which wins) or the arm's
`run.concurrency`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_haico.config.bounds import Concurrency
from pytest_haico.config.limits import AUTO, MAX_CONCURRENCY
from pytest_haico.errors import ConfigError

if TYPE_CHECKING:
    from pytest_haico.config.sections import RunSection


def parse_concurrency(value: Any, source: str) -> Concurrency:
    """`auto`, or an integer from 1 to MAX_CONCURRENCY."""
    text = str(value).strip()
    if text.lower() == AUTO:
        return AUTO
    try:
        number = int(text)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_CONCURRENCY:
        raise ConfigError(
            source,
            "",
            f"expected an integer from 1 to {MAX_CONCURRENCY} or auto (adapt to the model's "
            f"load), got {value!r}",
        )
    return number


@dataclass(frozen=True)
class ConcurrencyPlan:
    """The in-flight limit of one arm's run: `maximum` at once, starting at `initial`;
    `adaptive` (auto) moves it within [1, maximum] as the model's load says."""

    adaptive: bool
    initial: int
    maximum: int

    def describe(self) -> str:
        return f"auto (1 to {self.maximum})" if self.adaptive else str(self.maximum)


def resolve_concurrency(option: Concurrency | None, run: RunSection) -> ConcurrencyPlan:
    """The option (when given) over the arm's `run.concurrency`; auto starts at 1 and is
    bounded by the arm's `max_concurrency`."""
    chosen = option if option is not None else run.concurrency
    if chosen == AUTO:
        return ConcurrencyPlan(adaptive=True, initial=1, maximum=run.max_concurrency)
    assert isinstance(chosen, int)
    return ConcurrencyPlan(adaptive=False, initial=chosen, maximum=chosen)
