"""Items, their ids, and how a run selects, limits, shards and orders them."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import cast

import pytest

from pytest_haico.campaign.selection import Selection
from pytest_haico.config.settings import Settings
from pytest_haico.config.shard import Shard
from tests.harness import CampaignProject

NODE = "experiments/test_conversations.py::test_conversation"


def collected(result: pytest.RunResult) -> list[str]:
    """Test ids of the collected items, in run order, from --collect-only -q."""
    return [
        m.group(1)
        for line in result.outlines
        if (m := re.match(re.escape(NODE) + r"\[(.+)\]$", line))
    ]


def test_items_are_arm_script_repeat(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: plan\nrepeats: 2\nturns:\n  - user: hi\n")
    result = campaign.run("--collect-only", "-q")
    assert collected(result) == ["demo-plan-r0", "demo-plan-r1"]


def test_haico_arm_is_exact_while_k_is_a_substring(campaign: CampaignProject) -> None:
    campaign.arm("qwen32b")
    campaign.arm("qwen32b-awq")
    campaign.simple_scripts("greet")
    by_k = collected(campaign.run("--collect-only", "-q", "-k", "qwen32b"))
    assert by_k == ["qwen32b-greet-r0", "qwen32b-awq-greet-r0"]
    by_arm = collected(campaign.run("--collect-only", "-q", "--haico-arm", "qwen32b"))
    assert by_arm == ["qwen32b-greet-r0"]
    two = collected(
        campaign.run("--collect-only", "-q", "--haico-arm", "qwen32b", "--haico-arm", "qwen32b-awq")
    )
    assert len(two) == 2


def test_haico_stratum_selects_exactly(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b", stratum="short")
    campaign.scripts("c.yaml", "id: c\nstratum: shorter\nturns:\n  - user: hi\n")
    assert collected(campaign.run("--collect-only", "-q", "--haico-stratum", "short")) == [
        "demo-a-r0",
        "demo-b-r0",
    ]


def test_limit_per_stratum_keeps_the_first_n_of_each_arm_and_stratum(
    campaign: CampaignProject,
) -> None:
    campaign.arm("one")
    campaign.arm("two")
    campaign.simple_scripts("s1", "s2", "s3", stratum="short")
    campaign.scripts(
        "long.jsonl",
        "".join(
            f'{{"id": "l{i}", "stratum": "long", "turns": [{{"user": "long {i}"}}]}}\n'
            for i in range(3)
        ),
    )
    result = campaign.run("--collect-only", "-q", "--haico-limit-per-stratum", "2")
    assert collected(result) == [
        "one-l0-r0",
        "one-l1-r0",
        "one-s1-r0",
        "one-s2-r0",
        "two-l0-r0",
        "two-l1-r0",
        "two-s1-r0",
        "two-s2-r0",
    ]


def test_a_limit_over_shards_is_the_limit_in_all_dealt_over_the_shards(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("s1", "s2", "s3", "s4", "s5", stratum="short")
    campaign.scripts("solo.yaml", "id: solo\nstratum: long\nturns:\n  - user: hi\n")
    limit = ("--collect-only", "-q", "--haico-limit-per-stratum", "2")
    first = collected(campaign.run(*limit, "--haico-shard=0/2"))
    second = collected(campaign.run(*limit, "--haico-shard=1/2"))
    assert first == ["demo-s1-r0", "demo-solo-r0"]
    assert second == ["demo-s2-r0"]


def test_script_tags_are_markers_and_keywords(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts(
        "a.yaml",
        """
        - id: quick
          tags: [smoke]
          turns: [{user: hi}]
        - id: slow
          tags: [long_run]
          turns: [{user: hello}]
        """,
    )
    assert collected(campaign.run("--collect-only", "-q", "--strict-markers", "-m", "smoke")) == [
        "demo-quick-r0"
    ]
    assert collected(campaign.run("--collect-only", "-q", "-k", "long_run")) == ["demo-slow-r0"]
    campaign.run("--markers").stdout.fnmatch_lines(["@pytest.mark.smoke: script tag*"])


def test_shards_are_disjoint_exhaustive_and_stable(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts(*(f"s{i:02d}" for i in range(30)))
    everything = set(collected(campaign.run("--collect-only", "-q")))
    shards = [
        set(collected(campaign.run("--collect-only", "-q", f"--haico-shard={i}/3")))
        for i in range(3)
    ]
    assert set.union(*shards) == everything and sum(map(len, shards)) == len(everything)
    assert all(shards)
    campaign.simple_scripts(*(f"new{i:02d}" for i in range(10)))
    after = [
        set(collected(campaign.run("--collect-only", "-q", f"--haico-shard={i}/3")))
        for i in range(3)
    ]
    for before_shard, after_shard in zip(shards, after, strict=True):
        assert after_shard & everything == before_shard


def test_a_job_array_task_must_give_its_shard(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "100")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    result = campaign.run("--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*--haico-shard: this run is a Slurm array task*pass "
            "--haico-shard $SLURM_ARRAY_TASK_ID/<array size>*"
        ]
    )
    assert campaign.run("--collect-only", "--haico-shard", "1/2").ret == pytest.ExitCode.OK


SHUFFLE = """
import random

def pytest_collection_modifyitems(items):
    random.Random({seed}).shuffle(items)
"""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_items_are_grouped_by_arm_after_reordering(campaign: CampaignProject, seed: int) -> None:
    for name in ("alpha", "beta", "gamma"):
        campaign.arm(name)
    campaign.simple_scripts(*(f"s{i}" for i in range(6)))
    (campaign.experiments / "conftest.py").write_text(SHUFFLE.format(seed=seed))
    order = [test_id.split("-")[0] for test_id in collected(campaign.run("--collect-only", "-q"))]
    assert len(order) == 18
    groups = [arm for i, arm in enumerate(order) if i == 0 or order[i - 1] != arm]
    assert sorted(groups) == ["alpha", "beta", "gamma"]  # each arm is one contiguous run


def test_failed_first_keeps_arms_together(
    pytester: pytest.Pytester, campaign: CampaignProject
) -> None:
    for name in ("alpha", "beta"):
        campaign.arm(name)
    campaign.simple_scripts("a", "b")
    campaign.scripts("z.yaml", "id: z\nturns:\n  - user: fail here\n")
    first = pytester.runpytest("experiments", "--haico-no-resume")
    first.assert_outcomes(passed=4, failed=2)
    again = pytester.runpytest("experiments", "--haico-no-resume", "--ff", "-v")
    verbose_line = re.escape(NODE) + r"\[(\w+)-\S+\] (?:PASSED|FAILED)"
    order = [m.group(1) for line in again.outlines if (m := re.match(verbose_line, line))]
    groups = [arm for i, arm in enumerate(order) if i == 0 or order[i - 1] != arm]
    assert len(order) == 6 and sorted(groups) == ["alpha", "beta"]


def test_xdist_with_haico_items_points_to_concurrency_and_arrays(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    result = campaign.run("-n", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*-n / --numprocesses: haico items cannot run under "
            "pytest-xdist*--haico-concurrency N*--haico-shard I/N*"
        ]
    )


def test_script_files_are_found_by_suffix_whatever_its_case(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("a.YAML", "id: a\nturns:\n  - user: hi a\n")
    campaign.scripts("b.yml", "id: b\nturns:\n  - user: hi b\n")
    campaign.scripts("c.JSONL", '{"id": "c", "turns": [{"user": "hi c"}]}\n')
    campaign.scripts("d.json", '{"id": "d", "turns": [{"user": "hi d"}]}\n')
    campaign.scripts(
        "e.json",
        '[{"id": "e1", "turns": [{"user": "hi e1"}]}, {"id": "e2", "turns": [{"user": "e2"}]}]',
    )
    campaign.scripts("README.md", "notes, not a script\n")
    assert collected(campaign.run("--collect-only", "-q")) == [
        "demo-a-r0",
        "demo-b-r0",
        "demo-c-r0",
        "demo-d-r0",
        "demo-e1-r0",
        "demo-e2-r0",
    ]


def test_arms_differing_only_outside_item_identity_are_separate_experiments(
    campaign: CampaignProject,
) -> None:
    # One served model (the arm name is the served name only when none is given).
    campaign.arm("fast", '[model]\nserved_name = "m"\n[run]\nconcurrency = 8\n')
    campaign.arm("slow", '[model]\nserved_name = "m"\n[run]\nconcurrency = 1\n')
    campaign.simple_scripts("s000", "s001")
    first = campaign.run("--haico-arm", "fast")
    first.assert_outcomes(passed=2)
    # The same item_ids in another arm are that arm's own items: not done because fast ran.
    second = campaign.run()
    second.assert_outcomes(passed=2)
    second.stdout.fnmatch_lines(["haico: 2 done in ledger, 2 to run (0 retries)"])
    assert len(campaign.records("slow")) == 2


def test_scripts_with_the_same_turns_are_named_both(campaign: CampaignProject) -> None:
    campaign.arm("one")
    campaign.arm("two")
    campaign.scripts("a.yaml", "id: a\nturns:\n  - user: hi\n")
    campaign.scripts("b.jsonl", '{"id": "x", "turns": [{"user": "other"}]}\n')
    campaign.scripts("c.jsonl", '{"id": "y", "turns": [{"user": "yet another"}]}\n')
    campaign.scripts("d.jsonl", '\n{"id": "b", "tags": ["t"], "turns": [{"user": "hi"}]}\n')
    result = campaign.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*d.jsonl:2 (script 1): turns: script 'b' has the same turns and expectations as "
            "script 'a' (*a.yaml): one experiment under two names; change or remove one of them"
        ]
    )


def test_a_tag_equal_to_an_arm_name_is_refused(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.arm("other")
    campaign.scripts("a.yaml", "id: a\ntags: [smoke, demo]\nturns:\n  - user: hi\n")
    result = campaign.run("--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*a.yaml: tag 2: 'demo' is also the name of arm 'demo' (*arms/demo.toml): "
            "-k demo would select this script in every arm; rename the tag"
        ]
    )


def test_k_with_an_arm_name_that_selects_other_arms_points_to_haico_arm(
    campaign: CampaignProject,
) -> None:
    campaign.arm("qwen32b")
    campaign.arm("qwen32b-awq")
    campaign.arm("llama")
    campaign.simple_scripts("greet")
    result = campaign.run("--collect-only", "-q", "-k", "qwen32b")
    result.stdout.fnmatch_lines(
        [
            "haico: -k qwen32b also selected items of arm qwen32b-awq: -k matches substrings "
            "of test ids and script tags; select exact arms with --haico-arm qwen32b"
        ]
    )
    for exact in (("-k", "qwen32b-awq"), ("-k", "qwen32b", "--haico-arm", "qwen32b")):
        assert "haico: -k" not in campaign.run("--collect-only", "-q", *exact).stdout.str()


def test_a_shard_with_nothing_of_its_own_still_says_why_it_runs_nothing() -> None:
    settings = cast(
        Settings,
        SimpleNamespace(gates_only=False, resume=True, items=None, shard=Shard(5, 6)),
    )
    lines = Selection(out_of_shard=24).status_lines(settings)
    assert lines == ["haico: 0 done in ledger, 0 to run (0 retries); shard 5/6: 24 in other shards"]
