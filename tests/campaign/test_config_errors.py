"""A malformed arm, script, option or cluster.env is a usage error naming file, field and fix."""

from __future__ import annotations

import pytest

from tests.harness import CampaignProject


def assert_usage_error(result: pytest.RunResult, *lines: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([*lines])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_duplicate_script_ids_name_both_files(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    campaign.scripts("more.yaml", "id: greet\nturns:\n  - user: again\n")
    assert_usage_error(
        campaign.run(),
        "*more.yaml: id: duplicate script id 'greet', already defined in *greet.jsonl:1*",
    )


def test_an_empty_arm_file_is_a_usage_error(campaign: CampaignProject) -> None:
    (campaign.experiments / "arms" / "demo.toml").write_text("")
    campaign.simple_scripts("greet")
    assert_usage_error(
        campaign.run(),
        '*arms/demo.toml: the arm file sets no key: write at least description = "..."',
    )


def test_unknown_arm_key_lists_the_valid_ones(campaign: CampaignProject) -> None:
    campaign.arm("demo", "[vllm]\nmax_model_length = 4096\n")
    campaign.simple_scripts("greet")
    assert_usage_error(
        campaign.run(),
        "*arms/demo.toml: vllm.max_model_length: unknown key; valid keys here: *max_model_len*",
    )


def test_unknown_script_key(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: a\nturn:\n  - user: hi\n")
    assert_usage_error(campaign.run(), "*a.yaml: turn: unknown key; valid keys here: id, *")


@pytest.mark.parametrize("branch_from", [1, 2])
def test_branch_from_must_name_an_earlier_turn(campaign: CampaignProject, branch_from: int) -> None:
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
        f"*a.yaml: turn 2, branch_from: must name an earlier turn, the first being 0 "
        f"(0..0 here), got {branch_from}",
    )


@pytest.mark.parametrize(
    ("filename", "text", "place"),
    [
        ("s.yaml", "- id: a\n  turns:\n    - user: hi\n\n- id: b\n  turns:\n    - user: ' '\n", 5),
        (
            "s.jsonl",
            '{"id": "a", "turns": [{"user": "hi"}]}\n\n{"id": "b", "turns": [{"user": " "}]}\n',
            3,
        ),
        (
            "s.json",
            '[{"id": "a", "turns": [{"user": "hi"}]},\n {"id": "b", "turns": [{"user": " "}]}]',
            None,
        ),
    ],
)
def test_a_bad_turn_is_named_counting_scripts_and_turns_from_one(
    campaign: CampaignProject, filename: str, text: str, place: int | None
) -> None:
    campaign.arm("demo")
    campaign.scripts(filename, text)
    line = f":{place}" if place else ""
    assert_usage_error(
        campaign.run(), f"*{filename}{line} (script 2): turn 1, user: must not be blank, got ' '"
    )


def test_empty_turn_list(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: a\nturns: []\n")
    assert_usage_error(campaign.run(), "*a.yaml: turns: List should have at least 1 item*")


@pytest.mark.parametrize("repeats", ["2.5", "'3'", "true"])
def test_non_integer_repeat(campaign: CampaignProject, repeats: str) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", f"id: a\nrepeats: {repeats}\nturns:\n  - user: hi\n")
    assert_usage_error(campaign.run(), "*a.yaml: repeats: Input should be a valid integer*")


def test_bad_arm_name(campaign: CampaignProject) -> None:
    campaign.arm("Qwen_32B")
    campaign.simple_scripts("greet")
    assert_usage_error(campaign.run(), "*Qwen_32B.toml: arm name 'Qwen_32B' (the file stem)*")


def test_bad_script_id(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: Plan Trip\nturns:\n  - user: hi\n")
    assert_usage_error(campaign.run(), "*a.yaml: id: String should match pattern*'Plan Trip'")


def test_toml_syntax_error_names_its_line(campaign: CampaignProject) -> None:
    campaign.arm("demo", "[vllm]\nmax_model_len = \n")
    campaign.simple_scripts("greet")
    assert_usage_error(campaign.run(), "*demo.toml: TOML syntax error: *(at line 2, column*")


def test_yaml_syntax_error_names_its_line(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: a\nturns:\n  - user: hi\n  - user: [unclosed\n")
    assert_usage_error(campaign.run(), "*a.yaml:5: YAML syntax error: *")


def test_jsonl_syntax_error_names_its_line(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("a.jsonl", '{"id": "a", "turns": [{"user": "hi"}]}\n{"id": "b",\n')
    assert_usage_error(campaign.run(), "*a.jsonl:2: JSON syntax error: *")


@pytest.mark.parametrize("tag", ["skip", "xfail", "parametrize", "usefixtures", "asyncio"])
def test_tag_with_a_pytest_marker_name_is_refused(campaign: CampaignProject, tag: str) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", f"id: a\ntags: [smoke, {tag}]\nturns:\n  - user: hi\n")
    assert_usage_error(
        campaign.run(), f"*a.yaml: tag 2: '{tag}' is one of pytest's own marker names*"
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
        (
            "--haico-concurrency=fast",
            "*--haico-concurrency: expected an integer from 1 to 1024 or auto (adapt to the "
            "model's load), got 'fast'",
        ),
        ("--haico-concurrency=0", "*--haico-concurrency: expected an integer from 1 to 1024*"),
        ("--haico-arm=nope", "*--haico-arm nope: no such arm; known arms: demo"),
        (
            "--haico-stratum=nope",
            "*--haico-stratum nope: no script has this stratum; known strata: default",
        ),
    ],
)
def test_bad_option(campaign: CampaignProject, option: str, message: str) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    assert_usage_error(campaign.run(option), message)


def test_bad_option_from_the_environment_names_the_variable(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    monkeypatch.setenv("PYTEST_HAICO_SHARD", "5/2")
    assert_usage_error(campaign.run(), "*environment variable PYTEST_HAICO_SHARD: invalid shard*")


def test_cluster_env_unknown_key(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    (campaign.experiments / "cluster.env").write_text("CLUSTER_WORK=/work\nVLLM_VNEV=/x\n")
    assert_usage_error(campaign.run(), "*cluster.env:2: VLLM_VNEV: unknown key; valid keys: *")


def test_cluster_env_malformed_line(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    (campaign.experiments / "cluster.env").write_text("# site\nCLUSTER_WORK /work\n")
    assert_usage_error(
        campaign.run(), "*cluster.env:2: expected KEY=VALUE, got 'CLUSTER_WORK /work'"
    )


def test_usage_error_keeps_earlier_results(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    assert campaign.run().ret == 0
    before = [p.read_bytes() for p in campaign.ledger_files("demo")]
    campaign.arm("demo", "[agent]\nrecursion_limit = 'many'\n")
    assert_usage_error(campaign.run(), "*demo.toml: agent.recursion_limit: *")
    assert [p.read_bytes() for p in campaign.ledger_files("demo")] == before


def test_no_arms_is_a_usage_error_not_an_empty_run(campaign: CampaignProject) -> None:
    campaign.simple_scripts("greet")
    assert_usage_error(campaign.run(), "*/experiments: no campaign items: add arms/<arm>.toml")


# -- issue 7: every bad input is refused at start, naming file and field -----------------


def assert_nothing_started(campaign: CampaignProject) -> None:
    assert not (campaign.root / "results").exists()


def test_empty_tool_call_parser_is_refused_before_anything_starts(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo", '[vllm]\ntool_call_parser = ""\n')
    campaign.simple_scripts("greet")
    assert_usage_error(
        campaign.run(),
        "*demo.toml: vllm.tool_call_parser: must name one of vLLM's tool call parsers "
        "(e.g. hermes, mistral, llama3_json), got ''",
    )
    assert_nothing_started(campaign)


def test_duplicate_yaml_key_names_file_line_and_key(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: a\nturns:\n  - user: hi\n    user: again\n")
    assert_usage_error(
        campaign.run(),
        "*a.yaml:4: duplicate key 'user' (first on line 3); each key may appear once in a mapping",
    )
    assert_nothing_started(campaign)


def test_duplicate_jsonl_key_names_file_line_and_key(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts(
        "a.jsonl",
        '{"id": "a", "turns": [{"user": "hi"}]}\n'
        '{"id": "b", "turns": [{"user": "ho"}], "id": "c"}\n',
    )
    assert_usage_error(
        campaign.run(), "*a.jsonl:2: duplicate key 'id'; each key may appear once in a mapping"
    )


BILLION_LAUGHS = """\
id: lol
turns: [{user: hi}]
description:
  - &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
  - &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
  - &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
  - &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
  - &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
  - &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
  - &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
  - &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
  - &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def test_billion_laughs_yaml_is_refused_at_its_first_anchor(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("lol.yaml", BILLION_LAUGHS)
    assert_usage_error(
        campaign.run(),
        "*lol.yaml:4: YAML anchors and aliases (&name, *name) are not accepted in script "
        "files: write each value out",
    )


def test_repeats_above_the_bound_are_refused(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: a\nrepeats: 1001\nturns:\n  - user: hi\n")
    assert_usage_error(
        campaign.run(), "*a.yaml: repeats: Input should be less than or equal to 1000, got 1001"
    )
    assert_nothing_started(campaign)


def test_absurd_recursion_limit_is_refused(campaign: CampaignProject) -> None:
    campaign.arm("demo", "[agent]\nrecursion_limit = 1000000000000000\n")
    campaign.simple_scripts("greet")
    assert_usage_error(
        campaign.run(),
        "*demo.toml: agent.recursion_limit: Input should be less than or equal to 1000, "
        "got 1000000000000000",
    )


def test_empty_jsonl_file_is_refused(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    campaign.scripts("empty.jsonl", "\n\n")
    assert_usage_error(
        campaign.run(), "*empty.jsonl: the file is empty; expected one script mapping per line"
    )


def test_no_experiments_directory_is_one_usage_error_for_campaign_fixtures(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
    )
    pytester.makepyfile(
        test_campaign="def test_a(haico_item):\n    pass\n"
        "def test_b(haico_conversation):\n    pass\n"
        "def test_plain():\n    pass\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert_usage_error(
        result,
        "ERROR: haico: test_campaign.py::test_a asks for haico_item, but no campaign was "
        "loaded: there is no experiments directory at */experiments; create it with "
        "arms/<arm>.toml and scripts/<name>.yaml, or point --haico-experiments "
        "(ini haico_experiments, env PYTEST_HAICO_EXPERIMENTS) at yours "
        "(2 tests ask for campaign fixtures)",
    )
    assert result.stderr.str().count("ERROR") == 1
    assert not (pytester.path / "results").exists()


ITEM_MODULE_LINES = [
    "    from pytest_haico import Conversation, Verdict",
    "    def test_conversation(haico_conversation: Conversation) -> None:",
    "        assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()",
]


def test_experiments_without_a_test_module_say_what_to_write(campaign: CampaignProject) -> None:
    (campaign.experiments / "test_conversations.py").unlink()
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    result = campaign.run()
    assert_usage_error(
        result,
        "ERROR: haico: */experiments: no test module asks for haico_conversation, so the "
        "campaign has no items; write */experiments/test_conversations.py:",
        *ITEM_MODULE_LINES,
    )
    assert_nothing_started(campaign)


def test_unit_tests_from_testpaths_get_a_hint_when_the_item_module_is_missing(
    pytester: pytest.Pytester, campaign: CampaignProject
) -> None:
    (campaign.experiments / "test_conversations.py").unlink()
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
        'testpaths = ["tests"]\n'
    )
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_unit.py").write_text("def test_unit():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "haico: no campaign item was collected: no test module in */experiments asks for "
            "haico_conversation; to run the campaign, write */experiments/test_conversations.py "
            "and run pytest */experiments:",
            *ITEM_MODULE_LINES,
        ]
    )


def test_unit_tests_get_no_hint_when_the_item_module_exists(
    pytester: pytest.Pytester, campaign: CampaignProject
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    (pytester.path / "test_unit.py").write_text("def test_unit():\n    pass\n")
    result = pytester.runpytest("test_unit.py", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "haico:" not in result.stdout.str()


def test_cluster_env_with_an_unset_variable_is_refused(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    monkeypatch.delenv("HAICO_TEST_UNSET", raising=False)
    (campaign.experiments / "cluster.env").write_text(
        "PARTITION=gpu\nCLUSTER_WORK=/scratch/$HAICO_TEST_UNSET/haico\n"
    )
    assert_usage_error(
        campaign.run(),
        "*cluster.env:2: CLUSTER_WORK: $HAICO_TEST_UNSET is not set (or empty) in the "
        "environment; set it, or write the value out",
    )
    assert_nothing_started(campaign)


@pytest.mark.parametrize(
    ("expect", "line"),
    [
        pytest.param(
            "{matches: '(Crete'}",
            "*a.yaml: turn 1, expect.matches: not a valid regular expression (missing ), "
            "unterminated subpattern at position 0); write Python `re` syntax, and escape a "
            "character meant literally with a backslash (\\( for '('), got '(Crete'",
            id="bad-regex",
        ),
        pytest.param(
            "{contain: Crete}",
            "*a.yaml: turn 1, expect.contain: unknown key; valid keys here: artifact, contains, "
            "matches, tool_called, tool_not_called, no_tool_error, max_steps, judge",
            id="unknown-key",
        ),
        pytest.param(
            "{max_steps: '3'}",
            "*a.yaml: turn 1, expect.max_steps: Input should be a valid integer, got '3'",
            id="max-steps-as-text",
        ),
        pytest.param(
            "{contains: 42}",
            "*a.yaml: turn 1, expect.contains: must be a string or a non-empty list of strings, "
            "got 42",
            id="contains-a-number",
        ),
        pytest.param(
            "{no_tool_error: 'yes'}",
            "*a.yaml: turn 1, expect.no_tool_error: Input should be a valid boolean, got 'yes'",
            id="no-tool-error-as-text",
        ),
    ],
)
def test_a_bad_expectation_names_file_field_value_and_fix(
    campaign: CampaignProject, expect: str, line: str
) -> None:
    campaign.arm("demo")
    campaign.scripts(
        "a.yaml", f"id: a\nturns:\n  - user: Plan a trip to Crete.\n    expect: {expect}\n"
    )
    assert_usage_error(campaign.run(), line)


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("--haico-limt=2", "--haico-limit-per-stratum"),
        ("--haico-concurency=4", "--haico-concurrency"),
        ("--haico-no-resum", "--haico-no-resume"),
        ("--haico-modle=judge", "--haico-model"),
    ],
)
def test_a_misspelled_haico_option_names_the_nearest_one(
    campaign: CampaignProject, typed: str, meant: str
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    name = typed.split("=")[0]
    assert_usage_error(
        campaign.run(typed),
        f"ERROR: haico: unrecognized option {name}: did you mean {meant}? `pytest --help` "
        "lists the haico options under 'pytest-haico'",
    )


def test_a_haico_option_like_none_is_refused_without_a_guess(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    assert_usage_error(
        campaign.run("--haico-zzzzzz"),
        "ERROR: haico: unrecognized option --haico-zzzzzz: no haico option is close to it; *",
    )


def test_other_unknown_options_keep_pytests_refusal(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    result = campaign.run("--no-such-option")
    assert_usage_error(result, "*unrecognized arguments: --no-such-option")
