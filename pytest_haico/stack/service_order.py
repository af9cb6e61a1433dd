"""The order of a stack's services: what each requires or waits for, who depends on whom,
and the waves they stop in."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_haico.errors import StackError
from pytest_haico.stack.service import Service


def check_order(services: Sequence[Service]) -> None:
    """Raise StackError unless the names are unique and every service is listed after what
    it requires or waits for."""
    names = [service.name for service in services]
    if len(set(names)) != len(names):
        raise StackError(f"duplicate service names in {names}")
    order: list[str] = []
    for service in services:
        for relation, needed in (
            ("requires", service.requires),
            ("waits for", service.waits_for),
        ):
            missing = [r for r in needed if r not in order]
            if missing:
                raise StackError(
                    f"{service.name} {relation} {missing}, which must be listed before it"
                )
        order.append(service.name)


def dependents(services: Sequence[Service], name: str) -> set[str]:
    """Every service that waits for `name`, directly or through another."""
    found: set[str] = set()
    for service in services:  # listed after what they wait for
        if name in service.waits_for or found & set(service.waits_for):
            found.add(service.name)
    return found


def stop_waves(services: Sequence[Service]) -> list[list[Service]]:
    """The services in stopping order, grouped: a service stops once every service that
    requires or waits for it has."""
    left = list(reversed(services))
    waves: list[list[Service]] = []
    while left:
        needed = {name for s in left for name in (*s.requires, *s.waits_for)}
        wave = [s for s in left if s.name not in needed] or left[:1]
        waves.append(wave)
        left = [s for s in left if s not in wave]
    return waves
