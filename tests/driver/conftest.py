"""The `converse` fixture: one conversation against a fake backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_haico.config.experiment import Arm, Script
from pytest_haico.driver.conversation import (
    ConversationProgress,
    ConversationSetup,
    run_conversation,
)
from tests.driver.driver_fakes import (
    BACKEND,
    ENDPOINT,
    THREAD,
    TOKEN,
    Conversation,
    Converse,
    FakeBackend,
    FakeSnapshots,
    make_arm,
    make_script,
)


@pytest.fixture
def converse(tmp_path: Path) -> Converse:
    """Run one conversation against a `FakeBackend`; keyword arguments go to its setup."""

    async def run(
        backend: FakeBackend,
        script: Script | None = None,
        *,
        arm: Arm | None = None,
        snapshots: FakeSnapshots | None = None,
        progress: ConversationProgress | None = None,
        transcript_header: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Conversation:
        snapshots = snapshots or FakeSnapshots()
        transcript = tmp_path / "transcripts" / "item.run.1.jsonl"
        kwargs.setdefault("snapshot_wait_s", 0.0)
        setup = ConversationSetup(
            backend_url=BACKEND,
            token=TOKEN,
            endpoint_url=ENDPOINT,
            arm=arm or make_arm(),
            snapshots=snapshots,
            **kwargs,
        )
        async with httpx.AsyncClient(transport=backend.transport()) as client:
            result = await run_conversation(
                client,
                setup,
                script=script or make_script(),
                thread_id=THREAD,
                transcript_path=transcript,
                transcript_header=transcript_header,
                progress=progress,
            )
        return Conversation(result, backend, snapshots, transcript)

    return run
