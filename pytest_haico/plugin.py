"""pytest-haico's hooks: options, configuration and the registration of its plugin objects."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

import pytest

from pytest_haico.config.settings import Profile, Settings, add_options, resolve_settings
from pytest_haico.errors import ConfigError

CAMPAIGN_PLUGIN = "haico-campaign"
NO_CAMPAIGN_PLUGIN = "haico-no-campaign"
SIGNALS_PLUGIN = "haico-signals"
FIXTURES_PLUGIN = "haico-fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "haico_item(spec): a scripted conversation of the campaign (set by pytest-haico)"
    )
    config.addinivalue_line(
        "markers", "haico_arm(name): the arm whose stack haico_stack / haico_client give this test"
    )
    from pytest_haico import fixtures

    config.pluginmanager.register(fixtures, FIXTURES_PLUGIN)
    settings = resolve_settings(config)
    _check_supported(settings)
    if not settings.experiments.is_dir():
        if settings.experiments_given:
            raise pytest.UsageError(
                f"haico: --haico-experiments {settings.experiments}: no such directory; it must "
                "hold arms/*.toml and scripts/*.yaml|*.jsonl"
            )
        config.pluginmanager.register(
            fixtures.NoCampaignPlugin(settings.experiments), NO_CAMPAIGN_PLUGIN
        )
        return
    # Heavy imports only when there is a campaign to run.
    from pytest_haico.campaign import CampaignPlugin
    from pytest_haico.config.cluster_env import load_cluster_env
    from pytest_haico.config.experiment import load_experiments
    from pytest_haico.config.items import build_item_specs
    from pytest_haico.config.slurm import SlurmJob
    from pytest_haico.ledger.recorder import Recorder
    from pytest_haico.runner.arm_runs import ARM_RUNS_KEY, ArmRuns

    try:
        job = SlurmJob.from_environ(os.environ)
        experiments = load_experiments(settings.experiments)
        site = load_cluster_env(settings.cluster_env) if settings.cluster_env else None
        settings = _with_site_results(settings, site.get("CLUSTER_WORK") if site else None)
        _check_selection(settings, experiments.arms.keys(), experiments.strata)
        _check_shard_given(settings, job.in_array)
        _check_xdist(config, settings.experiments)
        _check_not_empty(
            config, settings.experiments, bool(experiments.arms), bool(experiments.scripts)
        )
        specs = build_item_specs(
            experiments, settings, site_image=site.get("BACKEND_IMAGE") if site else None
        )
    except ConfigError as exc:
        raise pytest.UsageError(f"haico: {exc}") from None
    for tag in sorted(experiments.tags):
        config.addinivalue_line("markers", f"{tag}: script tag (pytest-haico)")
    recorder = Recorder(
        campaign_dir=settings.results / settings.campaign,
        campaign=settings.campaign,
        job=job,
        max_attempts=settings.max_attempts,
        shard=settings.shard,
        file_mode=settings.results_mode,
    )
    sessions = ArmRuns(settings, experiments.arms, recorder)
    config.stash[ARM_RUNS_KEY] = sessions
    config.pluginmanager.register(
        CampaignPlugin(
            settings,
            specs,
            recorder,
            sessions,
            collects_experiments=_collects(config, settings.experiments),
        ),
        CAMPAIGN_PLUGIN,
    )
    from pytest_haico.signals import SignalsPlugin

    config.pluginmanager.register(SignalsPlugin(), SIGNALS_PLUGIN)


def _check_supported(settings: Settings) -> None:
    """Options of the public interface whose machinery has not landed yet are refused now,
    not after an hour in the queue."""
    local = "use the local profile (the default)"
    unsupported = [
        ("--haico-profile cluster", settings.profile is Profile.CLUSTER, local),
        ("--haico-backend-image", settings.backend_image is not None, local),
        ("--haico-backend-cmd", settings.backend_cmd is not None, local),
        ("--haico-model-endpoint", settings.model_endpoint is not None, local),
        ("--haico-attach", settings.attach is not None, local),
        ("--haico-gates-only", settings.gates_only, local),
        (
            "--haico-drain-timeout",
            settings.sources.get("drain_timeout", "default") != "default",
            "leave it out: Ctrl-C stops at once and records the items in flight interrupted",
        ),
        (
            "--haico-dump-interval",
            settings.sources.get("dump_interval", "default") != "default",
            "leave it out: this version writes no database dumps",
        ),
    ]
    for option, given, advice in unsupported:
        if given:
            raise pytest.UsageError(
                f"haico: {option} is not available in this version of pytest-haico; {advice}"
            )


def _with_site_results(settings: Settings, cluster_work: str | None) -> Settings:
    if settings.sources.get("results") != "default" or not cluster_work:
        return settings
    if os.environ.get("CLUSTER_WORK"):
        return settings
    return dataclasses.replace(settings, results=Path(cluster_work) / "results")


def _check_selection(settings: Settings, arms: Iterable[str], strata: frozenset[str]) -> None:
    known_arms = sorted(arms)
    for arm in settings.arms:
        if arm not in known_arms:
            raise ConfigError(
                f"--haico-arm {arm}", "", f"no such arm; known arms: {', '.join(known_arms)}"
            )
    for stratum in settings.strata:
        if stratum not in strata:
            raise ConfigError(
                f"--haico-stratum {stratum}",
                "",
                f"no script has this stratum; known strata: {', '.join(sorted(strata))}",
            )


def _check_shard_given(settings: Settings, in_array: bool) -> None:
    if in_array and not settings.shard_given:
        raise ConfigError(
            "--haico-shard",
            "",
            "this run is a Slurm array task (SLURM_ARRAY_TASK_ID is set) but no shard was given: "
            "pass --haico-shard $SLURM_ARRAY_TASK_ID/<array size>, or every task runs every item",
        )


def _check_not_empty(
    config: pytest.Config, experiments: Path, has_arms: bool, has_scripts: bool
) -> None:
    """A campaign run with no arm or no script would "pass" having run nothing."""
    if (has_arms and has_scripts) or not _collects(config, experiments):
        return
    missing = "arms/<arm>.toml" if not has_arms else "scripts/<name>.yaml or .jsonl"
    raise ConfigError(str(experiments), "", f"no campaign items: add {missing}")


def _check_xdist(config: pytest.Config, experiments: Path) -> None:
    """`-n` with haico items: refused on the controller, before workers start stacks."""
    if getattr(config.option, "dist", "no") == "no" or hasattr(config, "workerinput"):
        return
    from pytest_haico.campaign import XDIST_MESSAGE

    if _collects(config, experiments):
        raise ConfigError("-n / --numprocesses", "", XDIST_MESSAGE.removeprefix("haico: "))


def _collects(config: pytest.Config, experiments: Path) -> bool:
    """Whether this run collects from the experiments directory (or a directory above it)."""
    return any(
        path.is_relative_to(experiments) or experiments.is_relative_to(path)
        for path in _collection_paths(config)
    )


def _collection_paths(config: pytest.Config) -> list[Path]:
    """The paths pytest will collect from (arguments, else testpaths, else the cwd)."""
    from_testpaths = config.args_source is pytest.Config.ArgsSource.TESTPATHS
    base = Path(config.rootpath if from_testpaths else config.invocation_params.dir)
    return [(base / arg.split("::")[0]).resolve() for arg in config.args]
