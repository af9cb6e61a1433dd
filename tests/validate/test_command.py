"""`haico validate`'s command line: what it passes on, and the usage errors, each one line
with exit 2 before anything starts."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from pytest_haico.cli.main import main
from pytest_haico.config.values import parse_command
from pytest_haico.validate import session
from pytest_haico.validate.builds import ValidateError
from tests.harness import clear_campaign_environment


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with two arms, the current directory; no haico setting from outside."""
    clear_campaign_environment(monkeypatch)
    (tmp_path / "experiments" / "arms").mkdir(parents=True)
    for arm in ("alpha", "beta"):
        (tmp_path / "experiments" / "arms" / f"{arm}.toml").write_text(
            f'description = "arm {arm}"\n'
        )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _asked(monkeypatch: pytest.MonkeyPatch) -> list[session.Request]:
    """What `haico validate` asks of the validation, which runs nothing here."""
    asked: list[session.Request] = []

    def validate(request: session.Request, say: object) -> int:
        asked.append(request)
        return 0

    monkeypatch.setattr(session, "validate", validate)
    return asked


def test_pytest_arguments_after_the_double_dash_are_passed_on(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _asked(monkeypatch)
    argv = ["validate", "--baseline", "main", "--candidate", "./run --port {port}", "--arm"]
    assert main([*argv, "alpha", "--", "-k", "greet", "-m", "smoke"]) == 0
    (request,) = asked
    assert (request.baseline, request.candidate) == ("main", "./run --port {port}")
    assert (request.arm, request.campaign, request.attach) == ("alpha", None, None)
    assert request.pytest_args == ("-k", "greet", "-m", "smoke")
    assert request.backend_repo == Path()


def test_the_backend_command_of_a_commit_resolves_as_pytests_setting(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _asked(monkeypatch)
    monkeypatch.setenv("PYTEST_HAICO_BACKEND_CMD", "from-the-environment {port}")
    assert main(["validate", "--baseline", "a", "--candidate", "b"]) == 0
    assert main(["validate", "--baseline", "a", "--candidate", "b", "--backend-cmd", "x"]) == 0
    assert [r.resolver.get("backend_cmd", parse_command, None) for r in asked] == [
        "from-the-environment {port}",
        "x",
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--", "--haico-campaign=mine"], "--haico-campaign after --: haico validate sets it "
         "for both runs; give --campaign"),
        (["--", "-k", "x", "--haico-backend-cmd", "y"], "--haico-backend-cmd after --: haico "
         "validate sets it for both runs; give --baseline and --candidate"),
        (["--", "--haico-model-endpoint=http://vllm.localhost:1/v1"], "--haico-model-endpoint "
         "after --: haico validate sets it for both runs; give --attach"),
        ([], "{arms}/arms has 2 arms (alpha, beta): give --arm NAME, the arm whose items both "
         "builds run"),
        (["--arm", "gamma"], "{arms}/arms has no arm 'gamma' (alpha, beta): give --arm NAME, "
         "the arm whose items both builds run"),
        (["--arm", "alpha", "--baseline", "HEAD", "--backend-repo", "{root}"],
         "--baseline 'HEAD' is neither a commit of {root} (git rev-parse) nor a command (no "
         "program 'HEAD'): give a commit, or the backend's command line"),
        (["--arm", "alpha", "--campaign", "a/b"], "--campaign: invalid name 'a/b'; use a plain "
         "directory name"),
        (["--arm", "alpha", "--campaign", "done"], "{root}/results/done exists: each validation "
         "writes a new campaign, so the records of two validations never mix; give another "
         "--campaign"),
    ],
)  # fmt: skip
def test_a_usage_error_is_one_line_and_exit_2(
    project: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    (project / "results" / "done").mkdir(parents=True)
    argv = ["validate", "--baseline", "python -m a", "--candidate", "python -m b"]
    argv = [a.format(root=project) for a in argv + extra]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        f"haico: {message.format(root=project, arms=project / 'experiments')}\n",
    )


def test_both_builds_one_identity_is_refused_before_anything_runs(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["validate", "--arm", "alpha", "--baseline", "python -m b", "--candidate"]
    assert main([*argv, "python -m b"]) == 2
    assert capsys.readouterr().err == (
        "haico: --baseline 'python -m b' and --candidate 'python -m b' are the same build "
        "('python -m b' at git:none): give two builds\n"
    )
    assert not (project / "results").exists()


def test_a_missing_build_is_argparses_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["validate", "--baseline", "HEAD"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "haico validate: error: the following arguments are required: --candidate"
    )


def test_only_the_first_sigterm_raises_so_the_stop_it_starts_is_never_cut_short() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    stopped: list[str] = []
    with pytest.raises(session._Terminated), session._terminate_as_exception():
        try:
            signal.raise_signal(signal.SIGTERM)
        finally:
            signal.raise_signal(signal.SIGTERM)  # Slurm's next, while the run stops
            stopped.append("the worktree and the stack")
    assert stopped == ["the worktree and the stack"]
    assert signal.getsignal(signal.SIGTERM) == previous


def test_two_validations_of_one_name_cannot_both_take_its_campaign(tmp_path: Path) -> None:
    """Two started in the same second get the same default name, validate-<UTC second>."""
    campaign = tmp_path / "results" / "validate-20261205T160000Z"
    with session._new_campaign(campaign, 0o640):
        assert oct(campaign.stat().st_mode & 0o777) == "0o750"
        with (
            pytest.raises(ValidateError, match="exists: each validation writes a new"),
            session._new_campaign(campaign, 0o640),
        ):
            pass
        (campaign / "alpha").mkdir()  # the first one's records
    assert (campaign / "alpha").is_dir()


def test_a_validation_that_stops_before_it_records_leaves_no_campaign(tmp_path: Path) -> None:
    campaign = tmp_path / "results" / "validate-20261205T160000Z"
    with pytest.raises(KeyboardInterrupt), session._new_campaign(campaign, 0o640):
        raise KeyboardInterrupt
    assert not campaign.exists() and (tmp_path / "results").is_dir()
