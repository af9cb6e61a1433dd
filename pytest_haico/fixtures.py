"""The fixtures pytest-haico gives tests: the item, its conversation, the stack, a client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from pytest_haico.errors import InfraError, NotAdmittedError, RateLimitedError
from pytest_haico.ledger.recorder import ATTEMPT_KEY
from pytest_haico.ledger.verdicts import Outcome, Verdict
from pytest_haico.runner.arm_runs import ARM_RUNS_KEY, ArmRuns

# The stack's and the driver's modules load when a test first asks for them, not at
# every pytest start: a campaign of plain items never pays for them.
if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from pytest_haico.config.items import ItemSpec
    from pytest_haico.runner.arm_run import HaicoStack
    from pytest_haico.runner.finished import Conversation


@pytest.fixture
def haico_item(request: pytest.FixtureRequest) -> ItemSpec:
    """The item's spec (arm, script, repeat, item_id); pytest-haico parametrises it."""
    raise pytest.UsageError(
        f"haico: {request.node.nodeid} uses haico_item, but no campaign was loaded: is there an "
        "experiments directory (--haico-experiments) with arms/ and scripts/?"
    )


@pytest.fixture
def haico_conversation(request: pytest.FixtureRequest, haico_item: ItemSpec) -> Conversation:
    """The item's scripted conversation, run against the arm's stack; infra failures error.

    Conversations run concurrently in the campaign's event loop; this waits for the
    item's own one, whose ledger record is on disk by then.
    """
    state = request.node.stash.get(ATTEMPT_KEY, None)
    if state is None:
        raise pytest.UsageError(f"haico: {request.node.nodeid} is not a selected campaign item")
    try:
        conversation = _sessions(request).conversation(state)
    except NotAdmittedError as exc:
        # Never started (the run stopped early: a breaker, a dead service): no attempt, no record.
        pytest.skip(f"haico: not started: {exc.reason}")
    if conversation.verdict is Verdict.RATE_LIMITED:
        raise RateLimitedError(conversation.explain())
    if conversation.verdict.outcome is Outcome.ERROR:
        raise InfraError(conversation.explain())
    return conversation


@pytest.fixture
def haico_stack(request: pytest.FixtureRequest) -> HaicoStack:
    """The arm's running stack: service URLs, log paths, a read-only database DSN.

    The arm is the item's, else the one named by `@pytest.mark.haico_arm("name")`,
    else the only arm selected. Each arm's stack starts once per session.
    """
    return _sessions(request).stack(_arm_for(request))


@pytest_asyncio.fixture
async def haico_client(haico_stack: HaicoStack) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx.AsyncClient bound to the arm's backend, with its admin token."""
    from pytest_haico import httpclient  # httpx: not for a session that never asks

    async with httpclient.async_client(
        base_url=haico_stack.backend_url,
        headers={"Authorization": f"Bearer {haico_stack.admin_token}"},
        timeout=60.0,
    ) as client:
        yield client


def _sessions(request: pytest.FixtureRequest) -> ArmRuns:
    sessions = request.config.stash.get(ARM_RUNS_KEY, None)
    if sessions is None:
        raise pytest.UsageError(
            "haico: no campaign was loaded: is there an experiments directory with arms/?"
        )
    return sessions


def _arm_for(request: pytest.FixtureRequest) -> str:
    node: pytest.Item = request.node
    state = node.stash.get(ATTEMPT_KEY, None)
    if state is not None:
        return state.spec.arm.name
    marker = node.get_closest_marker("haico_arm")
    sessions = _sessions(request)
    if marker is not None and marker.args:
        name = str(marker.args[0])
        if name not in sessions.arms:
            raise pytest.UsageError(
                f"haico: haico_arm({name!r}): no such arm; known: {', '.join(sessions.arms)}"
            )
        return name
    selected = list(sessions.settings.arms) or list(sessions.arms)
    if len(selected) != 1:
        raise pytest.UsageError(
            f"haico: {request.node.nodeid} uses haico_stack, but {len(selected)} arms are "
            'selected: mark the test with @pytest.mark.haico_arm("<arm>") or pass --haico-arm'
        )
    return selected[0]


# Most specific first: `fixturenames` is the closure, so haico_conversation implies haico_item.
_CAMPAIGN_FIXTURES = ("haico_conversation", "haico_client", "haico_item", "haico_stack")


class NoCampaignPlugin:
    """Registered when no experiments directory was found: tests that need the campaign are
    one usage error at collection, not an error with a traceback per item."""

    def __init__(self, experiments: Path) -> None:
        self.experiments = experiments

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        asking = [(item, name) for item in items if (name := _campaign_fixture(item))]
        if not asking:
            return
        item, name = asking[0]
        count = f" ({len(asking)} tests ask for campaign fixtures)" if len(asking) > 1 else ""
        raise pytest.UsageError(
            f"haico: {item.nodeid} asks for {name}, but no campaign was loaded: there is no "
            f"experiments directory at {self.experiments}; create it with arms/<arm>.toml and "
            "scripts/<name>.yaml, or point --haico-experiments (ini haico_experiments, env "
            f"PYTEST_HAICO_EXPERIMENTS) at yours{count}"
        )


def _campaign_fixture(item: pytest.Item) -> str | None:
    names = getattr(item, "fixturenames", ())
    return next((name for name in _CAMPAIGN_FIXTURES if name in names), None)
