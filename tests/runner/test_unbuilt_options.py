"""The options of the graceful drain and the dumps are refused until that machinery exists."""

from __future__ import annotations

import re

import pytest

from pytest_haico.config.settings import OPTIONS

EXPERIMENTS = {
    "experiments/arms/demo.toml": "",
    "experiments/scripts/a.yaml": "id: a\nturns:\n  - user: hi\n",
    "experiments/test_conversations.py": "def test_conversation(haico_item):\n    pass\n",
}


@pytest.fixture
def campaign(pytester: pytest.Pytester) -> pytest.Pytester:
    for path, text in EXPERIMENTS.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
    )
    return pytester


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["--haico-drain-timeout=600"],
            {},
            "ERROR: haico: --haico-drain-timeout is not available in this version of "
            "pytest-haico; leave it out: Ctrl-C stops at once and records the items in flight "
            "interrupted",
        ),
        (
            [],
            {"PYTEST_HAICO_DRAIN_TIMEOUT": "0"},
            "ERROR: haico: --haico-drain-timeout is not available *",
        ),
        (
            ["--haico-dump-interval=0"],
            {},
            "ERROR: haico: --haico-dump-interval is not available in this version of "
            "pytest-haico; leave it out: this version writes no database dumps",
        ),
    ],
    ids=["drain-timeout", "drain-timeout-from-env", "dump-interval"],
)
def test_drain_timeout_and_dump_interval_are_refused_at_configure_time(
    campaign: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = campaign.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_the_help_promises_no_unbuilt_machinery(campaign: pytest.Pytester) -> None:
    for option in OPTIONS:
        assert not re.search(r"gate|usr1|dump", option.help, re.IGNORECASE), option
    result = campaign.runpytest("--help")
    result.stdout.fnmatch_lines(
        [
            "  --haico-drain-timeout=S",
            "*not available in this version",
            "  --haico-dump-interval=S",
            "*not available in this version",
        ]
    )
    unbuilt = {"gates_only", "backend_image", "backend_cmd", "model_endpoint", "attach"}
    for option in OPTIONS:
        if option.noun in unbuilt:
            assert option.help == "not available in this version", option
