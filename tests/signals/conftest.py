"""A campaign on the local profile's real stack, run in the background and signalled."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from pytest_haico.procfs import is_alive
from pytest_haico.stack.pgbinaries import find_postgres_binaries
from tests.harness import CONVERSATION_MODULE, CampaignProject

# A turn that makes the model call a tool: a hanging model then holds the turn's next request.
ARTIFACT_TURN = "Write it up as a document."

# A model that answers a conversation's first request and holds the next: a conversation
# whose first turn asks for an artifact (a tool call, then its result goes back) stays in
# flight until cancelled.
HANGING_ARM = """
[run]
concurrency = 2
turn_timeout_s = 600
[standin]
persona = "hang"
"""


def stack_campaign(campaign: CampaignProject, arm: str, *, items: int, text: str = "hello") -> None:
    """`items` one-turn scripts (`<text> <id>`) and the conversation test module: each item
    talks to the stack. With `HANGING_ARM`, pass `text=ARTIFACT_TURN`."""
    campaign.arm("demo", arm)
    campaign.simple_scripts(*(f"s{i:03d}" for i in range(items)), text=text)
    campaign.write("test_conversations.py", CONVERSATION_MODULE)


def run_dir(campaign: CampaignProject, arm: str = "demo") -> Path:
    """The one run directory of the arm (fails if there is not exactly one)."""
    (path,) = sorted((campaign.arm_dir(arm) / "runs").iterdir())
    return path


def llm_log_count(campaign: CampaignProject, text: str, arm: str = "demo") -> int:
    """How often `text` is in the model server's logs of the arm's runs so far."""
    return sum(
        log.read_text(errors="replace").count(text)
        for log in (campaign.arm_dir(arm) / "runs").glob("*/logs/llm.log")
    )


def hanging_requests(campaign: CampaignProject) -> int:
    return llm_log_count(campaign, "persona hang holds the request")


def services_alive(run: Path) -> list[dict[str, Any]]:
    """The services of a run directory whose process is still alive."""
    registry = json.loads((run / "services.json").read_text())
    return [s for s in registry["services"] if s.get("pid") and is_alive(s["pid"])]


def dumps(run: Path, kind: str) -> list[Path]:
    return sorted((run / "dumps").glob(f"{kind}-*.dump"))


def restorable(dump: Path) -> bool:
    """`pg_restore --list` of the server's own version accepts the dump."""
    pg_restore = find_postgres_binaries().tool("pg_restore")
    result = subprocess.run(
        [str(pg_restore), "--list", str(dump)], capture_output=True, text=True, check=False
    )
    return result.returncode == 0 and "TABLE DATA" in result.stdout


def verdicts(campaign: CampaignProject, arm: str = "demo") -> list[str]:
    return [record["verdict"] for record in campaign.records(arm)]
