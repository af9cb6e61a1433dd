"""A FIFO where a results file belongs (planted in a colleague's tree, or left by a mistake)
costs the reader a line at most, never a hang: `haico report`, `report --html`, `cost`,
`compare` and `show` each finish, and a share's claim that is a FIFO is refused by name."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from pytest_haico.cli.main import main
from pytest_haico.config.slurm import SlurmJob
from pytest_haico.errors import ResultsError
from pytest_haico.ledger.claims import Holder, claim_share
from tests.fifos import plant_fifo, without_waiting
from tests.results.ledgers import item_id, record, write_ledger

RUN_FILES = ("timeline.json", "model-metrics.csv", "claim.json", "run-config.json")


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    campaign = tmp_path / "results" / "c"
    write_ledger(campaign / "demo", "local-1.1", [record(f"a{i}") for i in range(3)])
    run_dir = campaign / "demo" / "runs" / "local-1.1"
    run_dir.mkdir(parents=True)
    (run_dir / "run-config.json").write_text(json.dumps({"values": {"NODE": "gpu017"}}))
    (run_dir / "claim.json").write_text(json.dumps({"claimed_at": 1_790_000_000.0}))
    return campaign


@pytest.mark.parametrize("name", RUN_FILES)
def test_every_command_finishes_with_a_fifo_in_a_runs_place(
    campaign: Path, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = plant_fifo(campaign / "demo" / "runs" / "local-1.1" / name)
    page = tmp_path / "report.html"
    for argv in (
        ["report", str(campaign)],
        ["report", str(campaign), "--html", str(page)],
        ["cost", str(campaign)],
        ["compare", str(campaign), str(campaign)],
        ["show", item_id("a0"), "--campaign", str(campaign)],
    ):
        assert without_waiting(functools.partial(main, argv), fifo) == 0, argv
    named = f"{fifo}: unreadable (is a FIFO, not a regular file)"
    if name == "timeline.json":  # its allocation is left out, in the terminal and the page
        assert named in capsys.readouterr().out and named in page.read_text()
    if name == "model-metrics.csv":  # its samples are plotted on the page only
        assert named in page.read_text()


def test_a_transcript_that_is_a_fifo_is_named_by_show_and_on_the_page(
    campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transcripts = campaign / "demo" / "transcripts"
    fifo = plant_fifo(transcripts / f"{item_id('a0')}.local-1.1.1.jsonl")
    page = tmp_path / "report.html"
    show = ["show", item_id("a0"), "--campaign", str(campaign)]
    assert without_waiting(lambda: main(show), fifo) == 2  # as for one it may not read
    named = (
        f"cannot read the transcript {fifo}: it is a FIFO, not a regular file: "
        f"move it out of {transcripts}"
    )
    assert named in capsys.readouterr().err
    html = ["report", str(campaign), "--html", str(page)]
    assert without_waiting(lambda: main(html), fifo) == 0
    assert named in page.read_text()


def test_a_share_claim_that_is_a_fifo_is_refused_naming_it(tmp_path: Path) -> None:
    fifo = plant_fifo(tmp_path / "shard-0of1.default.json")
    me = Holder.current(SlurmJob.from_environ({}), "local-1.1")
    with pytest.raises(ResultsError) as refused:
        without_waiting(lambda: claim_share(fifo, me, share="demo", file_mode=0o640), fifo)
    assert str(refused.value) == (
        f"demo: the claim {fifo} is a FIFO, not a regular file: remove it, then rerun"
    )
