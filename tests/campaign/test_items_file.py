"""--haico-items FILE: a run of the items a file lists, sharded by their position in it (how
`haico continue --tasks M` splits exactly the owed items over M array tasks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_haico.config.item_list import ItemList, parse_item_list
from pytest_haico.config.shard import Shard
from pytest_haico.config.slurm import SlurmJob
from pytest_haico.ledger.claims import Holder
from pytest_haico.ledger.layout import ArmPaths
from tests.campaign.test_selection import collected
from tests.harness import CampaignProject

SCRIPTS = [f"s{i}" for i in range(7)]
FORMAT = "test ids such as qwen32b-plan-trip-r0 (<arm>-<script id>-r<repeat>), one per line"


def two_arms(campaign: CampaignProject) -> None:
    campaign.arm("one")
    campaign.arm("two")
    campaign.simple_scripts(*SCRIPTS)


def items_file(campaign: CampaignProject, text: str, name: str = "owed.txt") -> Path:
    path = campaign.root / name
    path.write_text(text)
    return path


def test_only_the_listed_items_are_collected(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    two_arms(campaign)
    listed = items_file(
        campaign,
        "# owed by submission abc\n\ntwo-s5-r0\none-s3-r0  # retried once\n  one-s0-r0\n",
    )
    result = campaign.run("--collect-only", "-q", "--haico-items", str(listed))
    # The run keeps pytest's order (arm by arm); the file's order is its shards'.
    assert collected(result) == ["one-s0-r0", "one-s3-r0", "two-s5-r0"]
    monkeypatch.setenv("PYTEST_HAICO_ITEMS", listed.name)  # relative to the cwd
    by_env = collected(campaign.run("--collect-only", "-q"))
    assert by_env == ["one-s0-r0", "one-s3-r0", "two-s5-r0"]


@pytest.mark.parametrize("count", [1, 2, 3, 5, 12])
def test_shards_of_a_list_are_by_position_and_run_each_listed_item_once(
    campaign: CampaignProject, count: int
) -> None:
    two_arms(campaign)
    listed = [f"{arm}-{s}-r0" for s in reversed(SCRIPTS) for arm in ("two", "one")][:11]
    path = items_file(campaign, "\n".join(listed) + "\n")
    shards = [
        collected(
            campaign.run(
                "--collect-only", "-q", "--haico-items", str(path), f"--haico-shard={i}/{count}"
            )
        )
        for i in range(count)
    ]
    for index, shard in enumerate(shards):
        assert sorted(shard) == sorted(listed[index::count])
    assert sorted(t for shard in shards for t in shard) == sorted(listed)


def test_arm_stratum_and_limit_still_apply_to_a_list(campaign: CampaignProject) -> None:
    two_arms(campaign)
    campaign.simple_scripts("l0", "l1", "l2", stratum="long")
    every = [f"{arm}-{s}-r0" for arm in ("one", "two") for s in [*SCRIPTS, "l0", "l1", "l2"]]
    path = items_file(campaign, "\n".join(every) + "\n")
    by_arm = campaign.run(
        "--collect-only",
        "-q",
        "--haico-items",
        str(path),
        "--haico-arm",
        "two",
        "--haico-stratum",
        "long",
    )
    assert collected(by_arm) == ["two-l0-r0", "two-l1-r0", "two-l2-r0"]
    # Positions count in the whole file: shard 0/2 keeps the even lines of the list.
    limited = campaign.run(
        "--collect-only",
        "-q",
        "--haico-items",
        str(path),
        "--haico-shard",
        "0/2",
        "--haico-limit-per-stratum",
        "2",
    )
    # Scripts load by file name (l0.jsonl first); the limit keeps the first two of each arm
    # x stratum among the shard's items.
    assert collected(limited) == [
        "one-l1-r0",
        "one-s0-r0",
        "one-s2-r0",
        "two-l1-r0",
        "two-s0-r0",
        "two-s2-r0",
    ]


def test_the_status_line_counts_what_the_list_leaves_out(campaign: CampaignProject) -> None:
    two_arms(campaign)
    path = items_file(campaign, "one-s1-r0\none-s2-r0\ntwo-s1-r0\n")
    result = campaign.run("--haico-items", str(path), "--haico-shard", "0/2")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            f"haico: 0 done in ledger, 2 to run (0 retries); 11 not in --haico-items {path}; "
            "shard 0/2: 1 in other shards"
        ]
    )
    again = campaign.run("--haico-items", str(path))
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines(
        [f"haico: 2 done in ledger, 1 to run (0 retries); 11 not in --haico-items {path}"]
    )


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        (
            "one-s1-r0\n# a comment\none-s9-r0\n",
            ":3",
            "'one-s9-r0' is no item of the experiments in {experiments} (test ids are "
            "<arm>-<script id>-r<repeat>, as pytest --collect-only -q shows them in brackets): "
            "fix or remove the line, or give the experiments the list was written for "
            "(--haico-experiments)",
        ),
        (
            "one-s1-r0\n\none-s2-r0\none-s1-r0 # again\n",
            ":4",
            "'one-s1-r0' is listed twice (also on line 1): list each item once, or the shards "
            "by position would run it twice",
        ),
        (
            "# nothing owed\n\n",
            "",
            f"lists no item (only blank lines and # comments); list {FORMAT}, or leave out "
            "--haico-items to run every item",
        ),
        (
            b"one-s1-r0\n\xff\n",
            ":2",
            f"not UTF-8 text; --haico-items takes {FORMAT}",
        ),
    ],
    ids=["unknown-id", "duplicate", "empty", "not-utf8"],
)
def test_a_bad_items_file_is_a_usage_error_naming_file_and_line(
    campaign: CampaignProject, text: str | bytes, where: str, message: str
) -> None:
    two_arms(campaign)
    path = campaign.root / "owed.txt"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = campaign.run("--collect-only", "--haico-items", "owed.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    source = f"{path}{where}" if where else f"--haico-items {path}"
    expected = f"ERROR: haico: {source}: " + message.format(experiments=campaign.experiments)
    assert result.stderr.lines[0] == expected
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_an_unreadable_items_file_is_a_usage_error(campaign: CampaignProject) -> None:
    two_arms(campaign)
    result = campaign.run("--collect-only", "--haico-items", "missing.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.lines[0] == (
        f"ERROR: haico: --haico-items {campaign.root / 'missing.txt'}: cannot be read: No such "
        f"file or directory; give a readable file of {FORMAT}"
    )


def test_a_list_claims_its_own_shares(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b", "c")
    path = items_file(campaign, "demo-c-r0\ndemo-a-r0\n")
    key = parse_item_list(path).key
    claim = campaign.arm_dir("demo") / "claims" / f"shard-0of2.items-{key}.default.json"
    assert claim == ArmPaths(campaign.arm_dir("demo")).share_claim(
        Shard(0, 2), "default", list_key=key
    )
    # A live run holds this list's shard 0/2 (this process: certainly alive).
    claim.parent.mkdir(parents=True)
    claim.write_bytes(
        Holder.current(SlurmJob.from_environ({"SLURM_JOB_ID": "77"}), "77.1").to_json()
    )
    refused = campaign.run("--haico-items", str(path), "--haico-shard", "0/2")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(
        [
            f"ERROR: haico: arm demo, shard 0/2 of list {key} (--haico-items {path}), stratum "
            "default is being run by run 77.1 (host *, pid *, Slurm job 77, since *); a second "
            f"run would run its items again.*remove {claim}, then rerun"
        ]
    )
    # Shard 0/2 by item_id, and the other shard of the list, are other shares.
    by_hash = campaign.run("--haico-shard", "0/2")
    assert by_hash.ret in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
    campaign.run("--haico-items", str(path), "--haico-shard", "1/2").assert_outcomes(passed=1)


def test_the_list_key_names_the_ids_in_order() -> None:
    one = ItemList(path=Path("a"), test_ids=("x-a-r0", "x-b-r0"), lines=(1, 2))
    same = ItemList(path=Path("b"), test_ids=("x-a-r0", "x-b-r0"), lines=(3, 9))
    other = ItemList(path=Path("a"), test_ids=("x-b-r0", "x-a-r0"), lines=(1, 2))
    assert one.key == same.key != other.key
    assert re.fullmatch(r"[0-9a-f]{12}", one.key)
    assert [one.position(t) for t in ("x-a-r0", "x-b-r0", "x-c-r0")] == [0, 1, None]
