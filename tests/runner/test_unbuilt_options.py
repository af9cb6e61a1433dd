"""Every option's machinery has landed: none is refused for that; the drain, the dumps, the
gates-only and the cluster profile's options are accepted, and --haico-attach without a
kept stack is one line of usage error."""

from __future__ import annotations

import pytest

from pytest_haico.config.options import OPTIONS

EXPERIMENTS = {
    "experiments/arms/demo.toml": 'description = "demo"\n',
    "experiments/scripts/a.yaml": "id: a\nturns:\n  - user: hi\n",
    "experiments/test_conversations.py": "def test_conversation(haico_item):\n    pass\n",
}


@pytest.fixture
def experiments(pytester: pytest.Pytester) -> pytest.Pytester:
    for path, text in EXPERIMENTS.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
    )
    return pytester


def test_attach_to_a_state_file_that_is_not_there_is_one_line_of_usage_error(
    experiments: pytest.Pytester,
) -> None:
    result = experiments.runpytest("--haico-attach=stack.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: haico: --haico-attach */stack.json: no such state file; "
            "`haico stack status` lists the stacks kept up"
        ]
    )
    assert "Traceback" not in result.stderr.str()


@pytest.mark.parametrize(
    "args",
    [
        ["--haico-profile=cluster"],
        ["--haico-profile=cluster", "--haico-backend-image=docker://x@sha256:" + "0" * 64],
    ],
    ids=["profile", "profile+backend-image"],
)
def test_the_cluster_profile_and_its_backend_image_are_accepted(
    experiments: pytest.Pytester, args: list[str]
) -> None:
    result = experiments.runpytest("--collect-only", *args)
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    result.stdout.fnmatch_lines(["*<Function test_conversation*"])


def test_a_backend_image_on_the_local_profile_is_refused_naming_the_fix(
    experiments: pytest.Pytester,
) -> None:
    result = experiments.runpytest("--haico-backend-image=docker://x@sha256:" + "0" * 64)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: haico: --haico-backend-image runs the backend from an image, which only the "
            "cluster profile does (this run's profile is local): add --haico-profile cluster, "
            "or run a local build with --haico-backend-cmd CMD"
        ]
    )


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--haico-drain-timeout=5", "--haico-dump-interval=0"], {}),
        ([], {"PYTEST_HAICO_DRAIN_TIMEOUT": "0", "PYTEST_HAICO_DUMP_INTERVAL": "60"}),
    ],
    ids=["options", "environment"],
)
def test_drain_timeout_and_dump_interval_are_accepted(
    experiments: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = experiments.runpytest("--collect-only", *args)
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--haico-gates-only"], {}), ([], {"PYTEST_HAICO_GATES_ONLY": "1"})],
    ids=["option", "environment"],
)
def test_gates_only_is_accepted_and_deselects_every_item(
    experiments: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = experiments.runpytest("--collect-only", *args)
    # Only the gates would run: no item is left to collect.
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()
    result.stdout.fnmatch_lines(
        [
            "collected 1 item / 1 deselected / 0 selected",
            "haico: --haico-gates-only: the gates of arm(s) demo; no item runs (1 deselected)",
        ]
    )


def test_the_help_promises_no_unbuilt_machinery(experiments: pytest.Pytester) -> None:
    for option in OPTIONS:
        assert option.help != "not available in this version", option
    result = experiments.runpytest("--help")
    result.stdout.fnmatch_lines(
        [
            "  --haico-drain-timeout=S",
            "*grace in seconds for in-flight conversations after",
            "  --haico-dump-interval=S",
            "*seconds between periodic pg_dumps of the backend",
            "  --haico-gates-only*run each selected arm's preflight gates*",
        ]
    )
