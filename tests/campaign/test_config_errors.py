"""A malformed arm, script, option or cluster.env is a usage error naming file, field and fix."""

from __future__ import annotations

import pytest

from tests.campaign.conftest import CampaignDir


def assert_usage_error(result: pytest.RunResult, *lines: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([*lines])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_duplicate_script_ids_name_both_files(campaign: CampaignDir) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    campaign.scripts("more.yaml", "id: greet\nturns:\n  - user: again\n")
    assert_usage_error(
        campaign.run(),
        "*more.yaml: id: duplicate script id 'greet', already defined in *greet.jsonl:1*",
    )


def test_unknown_arm_key_lists_the_valid_ones(campaign: CampaignDir) -> None:
    campaign.arm("demo", "[vllm]\nmax_model_length = 4096\n")
    campaign.simple_scripts("greet")
    assert_usage_error(
        campaign.run(),
        "*arms/demo.toml: vllm.max_model_length: unknown key; valid keys here: *max_model_len*",
    )


def test_unknown_script_key(campaign: CampaignDir) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: a\nturn:\n  - user: hi\n")
    assert_usage_error(campaign.run(), "*a.yaml: turn: unknown key; valid keys here: id, *")


@pytest.mark.parametrize("branch_from", [1, 2])
def test_branch_from_must_name_an_earlier_turn(campaign: CampaignDir, branch_from: int) -> None:
    campaign.arm("demo")
    campaign.scripts(
        "a.yaml",
        f"""
        id: a
        turns:
          - user: one
          - user: two
            branch_from: {branch_from}
          - user: three
        """,
    )
    assert_usage_error(
        campaign.run(),
        f"*a.yaml: turns.1.branch_from: must name an earlier turn (0..0), got {branch_from}",
    )


def test_empty_turn_list(campaign: CampaignDir) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: a\nturns: []\n")
    assert_usage_error(campaign.run(), "*a.yaml: turns: List should have at least 1 item*")


@pytest.mark.parametrize("repeats", ["2.5", "'3'", "true"])
def test_non_integer_repeat(campaign: CampaignDir, repeats: str) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", f"id: a\nrepeats: {repeats}\nturns:\n  - user: hi\n")
    assert_usage_error(campaign.run(), "*a.yaml: repeats: Input should be a valid integer*")


def test_bad_arm_name(campaign: CampaignDir) -> None:
    campaign.arm("Qwen_32B")
    campaign.simple_scripts("greet")
    assert_usage_error(campaign.run(), "*Qwen_32B.toml: arm name 'Qwen_32B' (the file stem)*")


def test_bad_script_id(campaign: CampaignDir) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: Plan Trip\nturns:\n  - user: hi\n")
    assert_usage_error(campaign.run(), "*a.yaml: id: String should match pattern*'Plan Trip'")


def test_toml_syntax_error_names_its_line(campaign: CampaignDir) -> None:
    campaign.arm("demo", "[vllm]\nmax_model_len = \n")
    campaign.simple_scripts("greet")
    assert_usage_error(campaign.run(), "*demo.toml: TOML syntax error: *(at line 2, column*")


def test_yaml_syntax_error_names_its_line(campaign: CampaignDir) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: a\nturns:\n  - user: hi\n  - user: [unclosed\n")
    assert_usage_error(campaign.run(), "*a.yaml:5: YAML syntax error: *")


def test_jsonl_syntax_error_names_its_line(campaign: CampaignDir) -> None:
    campaign.arm("demo")
    campaign.scripts("a.jsonl", '{"id": "a", "turns": [{"user": "hi"}]}\n{"id": "b",\n')
    assert_usage_error(campaign.run(), "*a.jsonl:2: JSON syntax error: *")


@pytest.mark.parametrize("tag", ["skip", "xfail", "parametrize", "usefixtures", "asyncio"])
def test_tag_with_a_pytest_marker_name_is_refused(campaign: CampaignDir, tag: str) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", f"id: a\ntags: [smoke, {tag}]\nturns:\n  - user: hi\n")
    assert_usage_error(
        campaign.run(), f"*a.yaml: tags.1: '{tag}' is one of pytest's own marker names*"
    )


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "--haico-shard=3/3",
            "*--haico-shard: invalid shard '3/3': the index must be below N (0..2)*",
        ),
        ("--haico-shard=x", "*--haico-shard: invalid shard 'x'; expected I/N*"),
        ("--haico-max-attempts=0", "*--haico-max-attempts: expected an integer >= 1, got '0'"),
        ("--haico-exit=lenient", "*--haico-exit: invalid value 'lenient'; valid: strict, campaign"),
        ("--haico-arm=nope", "*--haico-arm nope: no such arm; known arms: demo"),
        (
            "--haico-stratum=nope",
            "*--haico-stratum nope: no script has this stratum; known strata: default",
        ),
    ],
)
def test_bad_option(campaign: CampaignDir, option: str, message: str) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    assert_usage_error(campaign.run(option), message)


def test_bad_option_from_the_environment_names_the_variable(
    campaign: CampaignDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    monkeypatch.setenv("PYTEST_HAICO_SHARD", "5/2")
    assert_usage_error(campaign.run(), "*environment variable PYTEST_HAICO_SHARD: invalid shard*")


def test_cluster_env_unknown_key(campaign: CampaignDir) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    (campaign.experiments / "cluster.env").write_text("CLUSTER_WORK=/work\nVLLM_VNEV=/x\n")
    assert_usage_error(campaign.run(), "*cluster.env:2: VLLM_VNEV: unknown key; valid keys: *")


def test_cluster_env_malformed_line(campaign: CampaignDir) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    (campaign.experiments / "cluster.env").write_text("# site\nCLUSTER_WORK /work\n")
    assert_usage_error(
        campaign.run(), "*cluster.env:2: expected KEY=VALUE, got 'CLUSTER_WORK /work'"
    )


def test_usage_error_keeps_earlier_results(campaign: CampaignDir) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    assert campaign.run().ret == 0
    before = [p.read_bytes() for p in campaign.ledger_files("demo")]
    campaign.arm("demo", "[agent]\nrecursion_limit = 'many'\n")
    assert_usage_error(campaign.run(), "*demo.toml: agent.recursion_limit: *")
    assert [p.read_bytes() for p in campaign.ledger_files("demo")] == before


def test_no_arms_is_a_usage_error_not_an_empty_run(campaign: CampaignDir) -> None:
    campaign.simple_scripts("greet")
    assert_usage_error(campaign.run(), "*/experiments: no campaign items: add arms/<arm>.toml")
