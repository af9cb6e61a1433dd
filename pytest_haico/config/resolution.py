"""The settings rule that `pytest` and `haico` share: a knob's value comes from the command
line, else the environment (`PYTEST_HAICO_<NOUN>`), else the ini file (`haico_<noun>`), else
its default; and where a project's experiments, site file and results are."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pytest_haico.config.cluster_env import ClusterEnv, load_cluster_env
from pytest_haico.config.options import BY_NOUN, Option
from pytest_haico.config.values import parse_bool, parse_name, parse_results_mode

_T = TypeVar("_T")

DEFAULT_CAMPAIGN = "default"
DEFAULT_RESULTS_MODE = 0o640


@dataclass(frozen=True)
class Lookup:
    """Where the knobs of one invocation are looked up, and what their paths are relative to."""

    cli: Mapping[str, tuple[Any, str]]  # noun -> (the value given, the flag that gave it)
    environ: Mapping[str, str]
    ini: Callable[[Option], Any]  # the option's ini value; None (or empty) when unset
    rootdir: Path  # ini paths, and the defaults, are relative to it
    invocation_dir: Path  # command-line and environment paths are relative to it


class Resolver:
    """Looks a knob up in CLI, env and ini order and remembers where each value came from;
    a bad value is a `ConfigError` naming its source."""

    def __init__(self, lookup: Lookup) -> None:
        self.lookup = lookup
        self.sources: dict[str, str] = {}

    def raw(self, option: Option) -> tuple[Any, str] | None:
        if option.noun in self.lookup.cli:
            return self.lookup.cli[option.noun]
        environ = self.lookup.environ
        if option.env in environ and environ[option.env] != "":
            env_value: Any = environ[option.env]
            if option.repeatable:
                env_value = [part for part in env_value.split(",") if part]
            elif option.flag:
                env_value = parse_bool(env_value, f"environment variable {option.env}")
            return env_value, f"environment variable {option.env}"
        ini_value = self.lookup.ini(option)
        if ini_value is not None and ini_value != [] and ini_value != "":
            return ini_value, f"ini option {option.dest}"
        return None

    def get(self, noun: str, parse: Callable[[Any, str], _T], default: _T) -> _T:
        found = self.raw(BY_NOUN[noun])
        if found is None:
            self.sources[noun] = "default"
            return default
        value, source = found
        self.sources[noun] = source
        return parse(value, source)

    def given(self, noun: str) -> bool:
        return self.sources.get(noun, "default") != "default"

    def path(self, value: Any, source: str) -> Path:
        """An ini file's path is relative to the rootdir, any other to where the command ran."""
        base = self.lookup.rootdir if source.startswith("ini") else self.lookup.invocation_dir
        return (base / str(value)).resolve()


@dataclass(frozen=True)
class Places:
    """Where a project's experiments, its site file and its results root are."""

    experiments: Path
    experiments_given: bool
    cluster_env: Path | None
    site: ClusterEnv | None  # the parsed cluster.env, when there is one
    results: Path
    catalogue: Path  # where served models register (`haico serve`)


def resolve_places(r: Resolver) -> Places:
    """The experiments (default `<rootdir>/experiments`), the cluster.env (default the one in
    the experiments, if any), the results root (default `$CLUSTER_WORK/results`, from
    the environment, else the cluster.env; else `<rootdir>/results`) and the catalogue of
    served models (default `$CLUSTER_WORK/catalogue`, else `<rootdir>/catalogue`)."""
    rootdir = r.lookup.rootdir
    experiments = r.get("experiments", r.path, rootdir / "experiments")
    experiments_given = r.given("experiments")
    default_cluster_env = experiments / "cluster.env"
    cluster_env = r.get(
        "cluster_env", r.path, default_cluster_env if default_cluster_env.is_file() else None
    )
    site = load_cluster_env(cluster_env) if cluster_env is not None else None
    # $CLUSTER_WORK of the environment wins over the site file's: it is what a shell sees.
    cluster_work = r.lookup.environ.get("CLUSTER_WORK") or (
        site.get("CLUSTER_WORK") if site else None
    )
    work = Path(cluster_work) if cluster_work else rootdir
    default_results = work / "results"
    return Places(
        experiments=experiments,
        experiments_given=experiments_given,
        cluster_env=cluster_env,
        site=site,
        results=r.get("results", r.path, default_results),
        catalogue=r.get("catalogue", r.path, work / "catalogue"),
    )


def resolve_campaign(r: Resolver) -> str:
    """The campaign's directory name under the results root."""
    return r.get("campaign", parse_name, DEFAULT_CAMPAIGN)


def resolve_results_mode(r: Resolver) -> int:
    """The mode of the files written under the results root."""
    return r.get("results_mode", parse_results_mode, DEFAULT_RESULTS_MODE)
