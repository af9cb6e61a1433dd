"""A record that may not be on disk is never counted as written: a failed append raises
`LedgerWriteError` naming the file system, leaves its fragment on a line of its own, and
stops the campaign with 75."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pytest_haico.errors import LedgerWriteError
from pytest_haico.ledger.format import iter_ledger
from pytest_haico.ledger.jsonl import LedgerWriter
from tests.campaign.test_ledger import make_record
from tests.harness import CONVERSATION_MODULE, CampaignProject
from tests.ledger.conftest import Mount, fill

ENOSPC = "[[]Errno 28[]] No space left on device"
FIX = (
    "Free space on that file system, or choose another results directory (--haico-results, "
    "CLUSTER_WORK), then rerun the same command: the items not done run again"
)


def read(path: Path) -> tuple[list[str], list[str]]:
    warnings: list[str] = []
    ids = [str(r.data["item_id"]) for r in iter_ledger(path, warn=warnings.append)]
    return ids, warnings


def test_a_failed_write_leaves_its_fragment_on_a_line_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ledger" / "run.jsonl"
    writer = LedgerWriter(path)
    writer.append(make_record("a" * 64))
    real_write = os.write

    def disk_full_mid_line(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data[:100]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", disk_full_mid_line)
    with pytest.raises(LedgerWriteError) as failed:
        writer.append(make_record("b" * 64))
    monkeypatch.undo()
    writer.append(make_record("c" * 64))
    writer.close()

    assert read(path) == (["a" * 64, "c" * 64], [f"{path}:2: skipped not valid JSON"])
    message = str(failed.value)
    assert message.startswith(
        f"cannot make a record durable in the ledger {path}: [Errno 28] No space left on "
        "device on the file system mounted at "
    )
    assert message.endswith(FIX.replace("[[]", "[").replace("[]]", "]"))


def test_a_full_file_system_tears_a_line_and_the_next_record_starts_on_a_fresh_one(
    tmpfs: Mount, tmp_path: Path
) -> None:
    ledger_dir = tmpfs(tmp_path / "ledger")
    path = ledger_dir / "run.jsonl"
    writer = LedgerWriter(path)
    writer.append(make_record(f"{0:064x}"))
    filler = fill(ledger_dir)
    written = 1
    with pytest.raises(LedgerWriteError) as failed:
        # The ledger's one page takes a few more records, then a line crosses its end.
        for written in range(1, 100):
            writer.append(make_record(f"{written:064x}"))
    assert not path.read_bytes().endswith(b"\n"), "the kernel wrote part of the line"
    assert f"on the file system mounted at {ledger_dir} (tmpfs from tmpfs, device " in str(
        failed.value
    )

    filler.unlink()
    writer.append(make_record("f" * 64))
    writer.close()
    ids, warnings = read(path)
    assert ids == [f"{i:064x}" for i in range(written)] + ["f" * 64]
    assert warnings == [f"{path}:{written + 1}: skipped not valid JSON"]


def test_a_full_ledger_file_system_stops_the_campaign_with_75_and_records_nothing_false(
    campaign: CampaignProject, tmpfs: Mount
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b", "c")
    ledger_dir = tmpfs(campaign.root / "results" / "default" / "demo" / "ledger")
    filler = fill(ledger_dir)

    full = campaign.run("--haico-exit", "campaign")
    assert full.ret == 75
    full.stdout.fnmatch_lines(
        [
            "demo a-r0 failed *.* s",
            "*= haico =*",
            f"stopped (exit 75): cannot make a record durable in the ledger {ledger_dir}/"
            f"local-*.1.jsonl: {ENOSPC} on the file system mounted at {ledger_dir} (tmpfs "
            f"from tmpfs, device *). {FIX}",
            "*! Interrupted: haico: a ledger record could not be written !*",
        ]
    )
    full.assert_outcomes(failed=1)  # the run stopped at the first item it could not record
    assert campaign.records("demo") == []

    filler.unlink()
    again = campaign.run("--haico-exit", "campaign")
    assert again.ret == 0
    again.stdout.fnmatch_lines(["haico: 0 done in ledger, 3 to run (0 retries)"])
    assert sorted(r["verdict"] for r in campaign.records("demo")) == ["completed"] * 3


def test_a_conversation_that_cannot_be_recorded_fails_in_one_line_not_a_traceback(
    campaign: CampaignProject, tmpfs: Mount
) -> None:
    campaign.arm("demo", "[run]\nconcurrency = 1\n")
    campaign.simple_scripts("a", "b")
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    fill(tmpfs(campaign.root / "results" / "default" / "demo" / "ledger"))

    full = campaign.run("--haico-exit", "campaign")
    assert full.ret == 75
    out = full.stdout.str()
    assert "Traceback" not in out and "\nE   " not in out
    full.stdout.fnmatch_lines(["LedgerWriteError: cannot make a record durable in the ledger *"])
