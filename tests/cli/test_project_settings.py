"""`haico` resolves the results root, a kept stack's campaign and its file mode by pytest's
settings rule (its flag, else `PYTEST_HAICO_<NOUN>`, else the project's `haico_<noun>`,
else the default), so a `pytest` run's results are where `haico report` and `haico cost`
look; a bad value is one line and exit 2."""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.cli.main import main
from pytest_haico.kept import control
from tests.harness import CampaignProject, clear_campaign_environment
from tests.results.ledgers import record, write_ledger


@pytest.fixture(autouse=True)
def _no_campaign_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_campaign_environment(monkeypatch)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose pytest.ini has no haico settings; haico runs in its sub/ directory."""
    root = tmp_path / "project"
    (root / "experiments" / "arms").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "sub").mkdir()
    monkeypatch.chdir(root / "sub")
    return root


def where_report_looks(capsys: pytest.CaptureFixture[str], results: Path, *args: str) -> Path:
    """Write campaign demo under `results`; the campaign directory `haico report demo`
    reports on (it fails with exit 2 if that is not there)."""
    write_ledger(results / "demo" / "demo", "local-1.1", [record("a")])
    status = main(["report", "demo", *args])
    out, err = capsys.readouterr()
    assert status == 0, err
    return Path(out.splitlines()[0].split(":")[0])


def test_the_results_flag_is_relative_to_where_haico_runs(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_HAICO_RESULTS", str(project / "from-env"))  # the flag wins
    (project / "pytest.ini").write_text("[pytest]\nhaico_results = from-ini\n")

    found = where_report_looks(capsys, project / "sub" / "r", "--results", "r")

    assert found == project / "sub" / "r" / "demo"


def test_the_environment_variable_is_relative_to_where_haico_runs(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_HAICO_RESULTS", "from-env")
    (project / "pytest.ini").write_text("[pytest]\nhaico_results = from-ini\n")

    found = where_report_looks(capsys, project / "sub" / "from-env")

    assert found == project / "sub" / "from-env" / "demo"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("pytest.ini", "[pytest]\nhaico_results = from-ini\n"),
        ("pyproject.toml", '[tool.pytest.ini_options]\nhaico_results = "from-ini"\n'),
    ],
)
def test_the_ini_key_is_relative_to_the_rootdir(
    project: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    text: str,
) -> None:
    (project / "pytest.ini").unlink()
    (project / name).write_text(text)
    monkeypatch.setenv("CLUSTER_WORK", str(project / "work"))  # the ini key wins

    found = where_report_looks(capsys, project / "from-ini")

    assert found == project / "from-ini" / "demo"


def test_the_default_is_under_cluster_work_of_the_environment_before_cluster_env(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "experiments" / "cluster.env").write_text(f"CLUSTER_WORK={project / 'site'}\n")
    monkeypatch.setenv("CLUSTER_WORK", str(project / "work"))

    found = where_report_looks(capsys, project / "work" / "results")

    assert found == project / "work" / "results" / "demo"


def test_the_default_is_under_cluster_work_of_the_cluster_env(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "experiments" / "cluster.env").write_text(f"CLUSTER_WORK={project / 'site'}\n")

    found = where_report_looks(capsys, project / "site" / "results")

    assert found == project / "site" / "results" / "demo"


def test_without_cluster_work_the_default_is_under_the_rootdir(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = where_report_looks(capsys, project / "results")

    assert found == project / "results" / "demo"


def test_the_experiments_and_their_cluster_env_come_from_the_ini_file(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "exp" / "arms").mkdir(parents=True)
    (project / "exp" / "cluster.env").write_text(f"CLUSTER_WORK={project / 'site'}\n")
    (project / "pytest.ini").write_text("[pytest]\nhaico_experiments = exp\n")
    write_ledger(project / "site" / "results" / "demo" / "demo", "local-1.1", [record("a")])

    assert main(["cost", "demo"]) == 0

    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(
        f"campaign {project / 'site' / 'results' / 'demo'}: remaining items from {project / 'exp'} "
    )


class KeptUp:
    """What `haico stack up` asked the kept stack for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[dict[str, Any]] = []
        monkeypatch.setattr(control, "up", self.up)

    def up(self, arm_name: str, **request: Any) -> int:
        self.calls.append({"arm": arm_name, **request})
        return 0

    def run(self, *args: str) -> dict[str, Any]:
        assert main(["stack", "up", "demo", *args]) == 0
        [call] = self.calls
        return call


@pytest.fixture
def kept_up(monkeypatch: pytest.MonkeyPatch) -> KeptUp:
    return KeptUp(monkeypatch)


def test_stack_up_defaults_to_campaign_default_and_mode_0640(
    project: Path, kept_up: KeptUp
) -> None:
    call = kept_up.run()

    assert (call["campaign_dir"], call["file_mode"]) == (project / "results" / "default", 0o640)
    assert (call["experiments"], call["cluster_env"]) == (project / "experiments", None)


def test_stack_up_takes_the_campaign_and_mode_from_the_ini_file(
    project: Path, kept_up: KeptUp
) -> None:
    (project / "pytest.ini").write_text(
        "[pytest]\nhaico_campaign = pilot\nhaico_results_mode = 0600\nhaico_results = out\n"
    )

    call = kept_up.run()

    assert (call["campaign_dir"], call["file_mode"]) == (project / "out" / "pilot", 0o600)


def test_stack_up_takes_the_environment_before_the_ini_file_and_its_flag_before_both(
    project: Path, kept_up: KeptUp, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "pytest.ini").write_text(
        "[pytest]\nhaico_campaign = pilot\nhaico_results_mode = 0600\n"
    )
    monkeypatch.setenv("PYTEST_HAICO_CAMPAIGN", "env-campaign")
    monkeypatch.setenv("PYTEST_HAICO_RESULTS_MODE", "0644")

    call = kept_up.run("--campaign", "flagged")

    assert (call["campaign_dir"], call["file_mode"]) == (project / "results" / "flagged", 0o644)


@pytest.mark.parametrize(
    ("ini", "env", "args", "message"),
    [
        (
            "",
            {"PYTEST_HAICO_CAMPAIGN": "../up"},
            (),
            "haico: environment variable PYTEST_HAICO_CAMPAIGN: invalid name '../up'; use a "
            "plain directory name",
        ),
        (
            "haico_results_mode = 0777\n",
            {},
            (),
            "haico: ini option haico_results_mode: invalid results mode '0777': a file mode has "
            "r and w bits only (no x, setuid, setgid or sticky bit); give an octal file mode "
            "such as 0640 (the default: the group may read) or 0644 (everyone may read)",
        ),
        ("", {}, ("--campaign", "a/b"), "haico: --campaign: invalid name 'a/b'; use a plain *"),
    ],
)
def test_a_bad_campaign_or_mode_is_one_line_and_exit_2_before_anything_starts(
    project: Path,
    kept_up: KeptUp,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    ini: str,
    env: dict[str, str],
    args: tuple[str, ...],
    message: str,
) -> None:
    (project / "pytest.ini").write_text("[pytest]\n" + ini)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    assert main(["stack", "up", "demo", *args]) == 2

    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert fnmatch.fnmatch(err.rstrip("\n"), message), err
    assert kept_up.calls == []


def test_a_malformed_pytest_configuration_is_one_line_and_exit_2(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "pyproject.toml").write_text("[tool.pytest.ini_options\n")
    (project / "pytest.ini").unlink()

    assert main(["cost", "demo"]) == 2

    err = capsys.readouterr().err
    assert err.startswith(f"haico: {project / 'pyproject.toml'}: cannot read the pytest ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("source", ["ini", "environment", "CLUSTER_WORK"])
def test_pytest_and_haico_agree_on_where_the_results_are(
    campaign: CampaignProject,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    source: str,
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    elsewhere = campaign.root / "elsewhere"
    if source == "ini":
        campaign.pytester.makepyprojecttoml(
            '[tool.pytest.ini_options]\nhaico_results = "elsewhere"\n'
            'asyncio_default_fixture_loop_scope = "function"\n'
        )
    elif source == "environment":
        monkeypatch.setenv("PYTEST_HAICO_RESULTS", str(elsewhere))
    else:
        monkeypatch.setenv("CLUSTER_WORK", str(campaign.root))
        elsewhere = campaign.root / "results"
    assert campaign.run().ret == 0
    assert len(list((elsewhere / "default" / "demo" / "ledger").glob("*.jsonl"))) == 1
    capsys.readouterr()
    monkeypatch.chdir(campaign.experiments)  # haico, like pytest, finds the project above

    assert main(["report", "default"]) == 0
    report = capsys.readouterr().out.splitlines()
    assert main(["cost", "default"]) == 0
    cost = capsys.readouterr().out.splitlines()

    assert report[0] == f"{elsewhere / 'default'}: 2 items, 2 records, 1 runs"
    assert cost[0].startswith(
        f"campaign {elsewhere / 'default'}: remaining items from {campaign.experiments} "
    )


@pytest.mark.parametrize("command", ["report", "cost"])
def test_without_a_campaign_report_and_cost_read_the_one_pytest_writes(
    project: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    write_ledger(project / "results" / "default" / "demo", "local-1.1", [record("a")])
    write_ledger(project / "results" / "named" / "demo", "local-1.1", [record("a")])
    assert main([command]) == 0
    assert str(project / "results" / "default") in capsys.readouterr().out

    (project / "pytest.ini").write_text("[pytest]\nhaico_campaign = named\n")
    assert main([command]) == 0
    assert str(project / "results" / "named") in capsys.readouterr().out
