"""Refusals at configure time: a run that cannot mean what the user asked stops here,
before any stack starts and before an allocation's hour is spent."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_haico.config.options import OPTIONS
from pytest_haico.config.project import find_project_config
from pytest_haico.config.settings import Profile, Settings
from pytest_haico.errors import ConfigError

if TYPE_CHECKING:
    from pytest_haico.config.experiment import Arm
    from pytest_haico.stack.kept import KeptState

XDIST_MESSAGE = (
    "haico: haico items cannot run under pytest-xdist (-n): every worker would start its own "
    "stack and claim its own run. Run conversations concurrently with --haico-concurrency N "
    "(one event loop, one stack), and scale out with Slurm job arrays and --haico-shard I/N."
)


def check_supported(settings: Settings) -> None:
    """Options that mean nothing on the chosen profile are refused now, not after an hour
    in the queue."""
    if settings.backend_image is not None and settings.profile is not Profile.CLUSTER:
        raise pytest.UsageError(
            "haico: --haico-backend-image runs the backend from an image, which only the "
            f"cluster profile does (this run's profile is {settings.profile.value}): add "
            "--haico-profile cluster, or run a local build with --haico-backend-cmd CMD"
        )


def check_rootdir(config: pytest.Config) -> None:
    """A haico option's value given as the next word (`--haico-attach FILE`) is, to pytest
    before plugins load, a test path, from which it looks for its rootdir and configuration
    file. Refused when that moved them from where pytest finds them without that word."""
    args = list(config.invocation_params.args)
    here = config.invocation_params.dir
    valued = {option.cli for option in OPTIONS if not option.flag}
    words = [(flag, value) for flag, value in itertools.pairwise(args) if flag in valued]
    words = [(flag, value) for flag, value in words if (here / value).exists()]
    if not words or config.option.inifilename:
        return  # pytest found nothing from them, or was told its configuration file
    start = here
    if config.args_source is pytest.Config.ArgsSource.ARGS:
        dirs = [(here / arg.split("::")[0]).resolve() for arg in config.args]
        start = Path(os.path.commonpath([d if d.is_dir() else d.parent for d in dirs]))
    bare = find_project_config(start)
    found = config.inipath
    if config.rootpath == bare.rootdir and found == bare.path:
        return
    if config.option.rootdir and found == bare.path:
        return  # --rootdir given: only the configuration file could have moved
    flag, value = words[0]
    moved = []
    if config.rootpath != bare.rootdir:
        moved.append(f"the rootdir {config.rootpath} instead of {bare.rootdir}")
    if found != bare.path:
        moved.append(f"the configuration {found or 'none'} instead of {bare.path or 'none'}")
    # The fix first: the rest is why, for whoever wonders.
    raise pytest.UsageError(
        f"haico: write {flag}={value} (with '='): pytest read the next word, {value}, as a "
        f"test path before haico's options were known, and took {' and '.join(moved)} "
        "from it"
    )


def check_selection(settings: Settings, arms: Iterable[str], strata: frozenset[str]) -> None:
    """--haico-arm and --haico-stratum name things that exist."""
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


def check_shard_given(settings: Settings, in_array: bool) -> None:
    """A job-array task runs its own share, never every item."""
    if in_array and not settings.shard_given:
        raise ConfigError(
            "--haico-shard",
            "",
            "this run is a Slurm array task (SLURM_ARRAY_TASK_ID is set) but no shard was given: "
            "pass --haico-shard $SLURM_ARRAY_TASK_ID/<array size>, or every task runs every item",
        )


def check_not_empty(
    config: pytest.Config, experiments: Path, has_arms: bool, has_scripts: bool
) -> None:
    """A campaign run with no arm or no script would "pass" having run nothing."""
    if (has_arms and has_scripts) or not collects(config, experiments):
        return
    missing = "arms/<arm>.toml" if not has_arms else "scripts/<name>.yaml or .jsonl"
    raise ConfigError(str(experiments), "", f"no campaign items: add {missing}")


def check_xdist(config: pytest.Config, experiments: Path) -> None:
    """`-n` with haico items: refused on the controller, before workers start stacks."""
    if getattr(config.option, "dist", "no") == "no" or hasattr(config, "workerinput"):
        return
    if collects(config, experiments):
        raise ConfigError("-n / --numprocesses", "", XDIST_MESSAGE.removeprefix("haico: "))


def collects(config: pytest.Config, experiments: Path) -> bool:
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


def check_attach(settings: Settings, kept: KeptState, arms: Mapping[str, Arm]) -> None:
    """--haico-attach: the kept stack serves what this run's arm file (and cluster.env, and
    --haico-backend-image) says, on this run's profile and backend; anything else would
    record items under settings nothing ran."""
    from pytest_haico.stack.kept import serve_changes, serves

    flag = f"--haico-attach {settings.attach}"
    arm = arms.get(kept.arm)
    if arm is None:
        raise pytest.UsageError(
            f"haico: {flag}: the kept stack serves arm {kept.arm}, which "
            f"{settings.experiments}/arms/ does not have: `haico stack down {kept.arm}`"
        )
    if settings.arms and set(settings.arms) != {kept.arm}:
        raise pytest.UsageError(
            f"haico: {flag}: the kept stack serves arm {kept.arm} only, not "
            f"{', '.join(a for a in settings.arms if a != kept.arm)}: select --haico-arm "
            f"{kept.arm}, or run without --haico-attach"
        )
    if settings.profile.value != kept.profile:
        raise pytest.UsageError(
            f"haico: {flag}: the kept stack runs the {kept.profile} profile: add "
            f"--haico-profile {kept.profile}"
        )
    if settings.backend_cmd != kept.backend_command or settings.model_endpoint is not None:
        kept_backend = "its own backend"
        if kept.backend_command:
            kept_backend = f"--haico-backend-cmd {kept.backend_command!r}"
        raise pytest.UsageError(
            f"haico: {flag}: the kept stack runs {kept_backend}; attach with the same backend "
            "and no --haico-model-endpoint, or start a stack for this run without --haico-attach"
        )
    site_image = settings.site.get("BACKEND_IMAGE") if settings.site is not None else None
    served = serves(
        arm, settings.profile, backend_image=settings.backend_image, site_image=site_image
    )
    changes = serve_changes(kept.serves, served)
    if changes:
        raise pytest.UsageError(
            f"haico: {kept.arm_file} (or the backend image) changed what the kept stack serves "
            "since `haico stack up` "
            f"({'; '.join(changes)}): `haico stack down {kept.arm}` then `haico stack up "
            f"{kept.arm}` to serve it, or undo the edit"
        )
