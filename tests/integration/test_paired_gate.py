"""The worked example end to end: 200 items on the stand-ins, arms made worse by a known
number of scripts (`[standin] blank_on`), and a candidate backend that loses the artifacts of
a known number; `haico compare` and `haico validate` find a 5-point drop at 95%, report a
1-point drop as not shown with the items needed to show it, and pass one flaky item."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_haico import procfs
from pytest_haico.cli.main import main
from tests.harness import CONVERSATION_MODULE, CampaignProject

ITEMS = 200
# Script i's text names what makes it fail in the worse arms: 10 "hard" ones (a 5-point
# drop), 2 "slight" ones (1 point), 1 "wobbly" one (a flaky item).
HARD = set(range(0, ITEMS, 20))
SLIGHT = {7, 123}
WOBBLY = {42}


def _text(i: int) -> str:
    marks = [
        w for w, chosen in (("hard", HARD), ("slight", SLIGHT), ("wobbly", WOBBLY)) if i in chosen
    ]
    return f"Question {i} ({' '.join(marks) or 'plain'}): how do I plan a meeting?"


def _arm(blank_on: str = "", run: str = "") -> str:
    standin = f'[standin]\nblank_on = "{blank_on}"\n' if blank_on else ""
    return f"[run]\nconcurrency = 16\n{run}{standin}"


def test_compare_finds_a_five_point_drop_and_not_a_one_point_one_or_a_flaky_item(
    campaign: CampaignProject, capsys: pytest.CaptureFixture[str]
) -> None:
    scripts = [{"id": f"q{i:03}", "turns": [{"user": _text(i)}]} for i in range(ITEMS)]
    campaign.scripts("q.jsonl", "".join(json.dumps(s) + "\n" for s in scripts))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    campaign.arm("base", _arm())
    campaign.arm("worse5", _arm(r"\\bhard\\b"))
    campaign.arm("worse1", _arm(r"\\bslight\\b"))
    # A pass rule: recorded in the run's run-config, where compare reads it.
    campaign.arm("flaky1", _arm(r"\\bwobbly\\b", 'pass_rule = "majority"\n'))
    run = campaign.run_subprocess("--haico-exit", "campaign", "--haico-campaign", "c", timeout=900)
    assert run.ret == 0, run.stdout.str()[-3000:]
    arms = campaign.root / "results" / "c"
    base, worse5, worse1, flaky1 = (
        str(arms / arm) for arm in ("base", "worse5", "worse1", "flaky1")
    )

    assert main(["compare", base, worse5, "--max-drop", "0.02", "--confidence", "0.95"]) == 1
    out = capsys.readouterr().out
    assert "    pass rate: A 100.0% [98.1, 100.0] (200/200), B 95.0% [91.0, 97.3] (190/200)" in out
    assert "    difference B − A: −5.0 points [−9.0, −2.1]" in out
    assert "    McNemar exact p = 0.00195 (discordant: 10 pass → fail, 0 fail → pass)" in out
    assert (
        "gate (--max-drop 0.02 --confidence 0.95): FAIL: pass rate dropped by more than 2 "
        "point(s) at 95%: the upper bound of B − A, −2.1 points, is below −2\n"
    ) in out

    assert main(["compare", base, worse1, "--max-drop", "0"]) == 0
    out = capsys.readouterr().out
    assert "    McNemar exact p = 0.5 (discordant: 2 pass → fail, 0 fail → pass)" in out
    assert (
        "pass: a drop of more than 0 point(s) in the pass rate is not shown at 95%: the upper "
        "bound of B − A, +1.0 points, is not below 0\n"
        "  to show a drop at 95% with 80% power, if the drop is 1.0 points and 1.0% of pairs "
        "differ: 783 pairs (now 200, 4 repeat(s) of each of the 200 scripts)\n"
    ) in out

    (config,) = (arms / "flaky1" / "runs").glob("*/run-config.json")
    assert json.loads(config.read_text())["values"]["ARM_RUN_PASS_RULE"] == "majority"
    assert main(["compare", base, flaky1, "--max-drop", "0.02"]) == 0
    assert "paired by script (pass_rule majority)" in capsys.readouterr().out
    assert main(["compare", base, flaky1, "--exit-on-regression"]) == 1  # the strict rule
    capsys.readouterr()

    assert main(["compare", base, worse1, "--plan"]) == 0
    out = capsys.readouterr().out
    assert "plan (--plan, power 80%): the pairs needed, from the measured discordance" in out
    assert "  cost: 783 pairs are 1,566 items, 1,166 more than the 400 now; at B" in out


# The candidate build: the stand-in backend whose steps lose their artifacts, so the scripts
# that expect one (HARD) fail with it and pass with the baseline.
BROKEN = """\
import sys

from pytest_haico.standins import backend, turns

step_event = turns.step_event
turns.step_event = lambda *args, **fields: step_event(*args, **{**fields, "artifact": None})
sys.exit(backend.main())
"""


@pytest.fixture
def own_tmpdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A $TMPDIR of its own (the kept stack's state directory and the worktrees), removed
    after; a supervisor a failed test left is killed first."""
    tmpdir = Path(tempfile.mkdtemp(prefix="haico-paired-test-"))
    tmpdir.chmod(0o711)  # a Postgres run as another user (under root) reaches its data
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    try:
        yield tmpdir
    finally:
        for path in tmpdir.glob("pytest-haico-*/stacks/*.json"):
            data = json.loads(path.read_text())
            if procfs.is_alive(data["supervisor_pid"], data["supervisor_start_time"]):
                os.kill(data["supervisor_pid"], signal.SIGKILL)
        shutil.rmtree(tmpdir, ignore_errors=True)


def test_validate_finds_a_five_point_drop_and_names_the_bound_that_decided(
    campaign: CampaignProject, own_tmpdir: Path
) -> None:
    scripts = [
        {
            "id": f"q{i:03}",
            # Each its own turns: the same turns under two names are refused.
            "turns": [{"user": f"Write note {i} up as a document.", "expect": {"artifact": True}}],
        }
        if i in HARD
        else {"id": f"q{i:03}", "turns": [{"user": f"Hello {i}."}]}
        for i in range(ITEMS)
    ]
    campaign.scripts("q.jsonl", "".join(json.dumps(s) + "\n" for s in scripts))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    campaign.arm("demo", "[run]\nconcurrency = 16\n")
    backend = campaign.root / "backend"
    backend.mkdir()
    (backend / "broken.py").write_text(BROKEN)
    python = shlex.quote(sys.executable)
    result = subprocess.run(
        [
            sys.executable, "-m", "pytest_haico", "validate", "--backend-repo", str(backend),
            "--baseline", f"{python} -m pytest_haico.standins.backend --port {{port}}",
            "--candidate", f"{python} broken.py --port {{port}}", "--max-drop", "0.02",
        ],
        cwd=campaign.root, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 1, out[-3000:] + result.stderr[-3000:]
    assert "    McNemar exact p = 0.00195 (discordant: 10 pass → fail, 0 fail → pass)" in out
    assert out.rstrip().endswith(
        "haico: validate: FAIL: pass rate dropped by more than 2 point(s) at 95%: the upper "
        "bound of B − A, −2.1 points, is below −2: exit 1"
    )
