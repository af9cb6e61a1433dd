"""The pytest run's settings: every knob resolved once, CLI > env > ini > default, into one
frozen `Settings`, and the kinds of value they take."""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.config.bounds import ARM_NAME, Concurrency
from pytest_haico.config.cluster_env import ClusterEnv
from pytest_haico.config.concurrency import parse_concurrency
from pytest_haico.config.item_list import ItemList, parse_item_list
from pytest_haico.config.options import OPTIONS
from pytest_haico.config.resolution import (
    Lookup,
    Resolver,
    resolve_campaign,
    resolve_places,
    resolve_results_mode,
)
from pytest_haico.config.shard import Shard, parse_shard
from pytest_haico.config.values import (
    MODEL_API_KEY_ENV,
    enum_parser,
    float_parser,
    int_parser,
    parse_bool,
    parse_command,
    parse_endpoint,
    parse_names,
    parse_text,
)
from pytest_haico.errors import ConfigError


class Profile(enum.StrEnum):
    """Which stack the campaign starts."""

    LOCAL = "local"
    CLUSTER = "cluster"


class ProgressMode(enum.StrEnum):
    """What a run prints per item: a line per finished conversation when the output is not a
    terminal (a batch job's log), pytest's own dots on one, or pytest's own always."""

    AUTO = "auto"
    LINES = "lines"
    OFF = "off"


class ExitMode(enum.StrEnum):
    """Exit-code semantics: pytest's own, or the campaign's (0 done, 75 resubmit, 78 no stack)."""

    STRICT = "strict"
    CAMPAIGN = "campaign"


@dataclass(frozen=True)
class Settings:
    """Every pytest-haico knob, resolved once at configure time."""

    profile: Profile
    results: Path
    campaign: str
    experiments: Path
    experiments_given: bool
    cluster_env: Path | None
    site: ClusterEnv | None  # the parsed cluster.env, when there is one
    arms: tuple[str, ...]
    strata: tuple[str, ...]
    limit_per_stratum: int | None
    shard: Shard
    shard_given: bool
    items_file: Path | None
    items: ItemList | None  # the ids items_file lists
    concurrency: Concurrency | None  # an arm's own when None
    resume: bool
    max_attempts: int
    drain_timeout: float
    dump_interval: float
    exit_mode: ExitMode
    progress: ProgressMode
    gates_only: bool
    backend_image: str | None
    backend_cmd: str | None
    backend_cmd_dir: Path  # where the backend command runs: the directory pytest started in
    model_endpoint: str | None
    model_api_key: str | None = field(repr=False)  # $HAICO_MODEL_API_KEY, never an option
    model: str | None  # --haico-model: a served model's catalogue name, for every arm
    judge: str | None  # --haico-judge: the served judge's catalogue name, for every arm
    catalogue: Path  # where served models register
    attach: Path | None
    results_mode: int
    sources: Mapping[str, str]


def resolve_settings(config: pytest.Config, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve every option; a bad value is a `pytest.UsageError` naming its source."""
    try:
        return _resolve(config, os.environ if environ is None else environ)
    except ConfigError as exc:
        raise pytest.UsageError(f"haico: {exc}") from None


def _resolve(config: pytest.Config, env: Mapping[str, str]) -> Settings:
    given = ((option, config.getoption(option.dest)) for option in OPTIONS)
    here = Path(config.invocation_params.dir)
    r = Resolver(
        Lookup(
            cli={option.noun: (value, option.cli) for option, value in given if value is not None},
            environ=env,
            ini=lambda option: config.getini(option.dest),
            rootdir=Path(config.rootpath),
            invocation_dir=here,
        )
    )
    places = resolve_places(r)
    shard = r.get("shard", parse_shard, Shard(0, 1))
    items_file = r.get("items", r.path, None)
    settings = Settings(
        profile=r.get("profile", enum_parser(Profile), Profile.LOCAL),
        results=places.results,
        campaign=resolve_campaign(r),
        experiments=places.experiments,
        experiments_given=places.experiments_given,
        cluster_env=places.cluster_env,
        site=places.site,
        arms=tuple(r.get("arm", parse_names, [])),
        strata=tuple(r.get("stratum", parse_names, [])),
        limit_per_stratum=r.get("limit_per_stratum", int_parser(minimum=1), None),
        shard=shard,
        shard_given=r.given("shard"),
        items_file=items_file,
        items=parse_item_list(items_file) if items_file is not None else None,
        concurrency=r.get("concurrency", parse_concurrency, None),
        resume=not r.get("no_resume", parse_bool, False),
        max_attempts=r.get("max_attempts", int_parser(minimum=1), 3),
        drain_timeout=r.get("drain_timeout", float_parser(minimum=0.0), 120.0),
        dump_interval=r.get("dump_interval", float_parser(minimum=0.0), 900.0),
        exit_mode=r.get("exit", enum_parser(ExitMode), ExitMode.STRICT),
        progress=r.get("progress", enum_parser(ProgressMode), ProgressMode.AUTO),
        gates_only=r.get("gates_only", parse_bool, False),
        backend_image=r.get("backend_image", parse_text, None),
        backend_cmd=r.get("backend_cmd", parse_command, None),
        backend_cmd_dir=here,
        model_endpoint=r.get("model_endpoint", parse_endpoint, None),
        model_api_key=env.get(MODEL_API_KEY_ENV) or None,
        model=r.get("model", parse_served_name, None),
        judge=r.get("judge", parse_served_name, None),
        catalogue=places.catalogue,
        attach=r.get("attach", r.path, None),
        results_mode=resolve_results_mode(r),
        sources=dict(r.sources),
    )
    if settings.model and settings.model_endpoint:
        raise pytest.UsageError(
            "haico: --haico-model and --haico-model-endpoint exclude each other; give one"
        )
    if settings.model and settings.attach:
        raise pytest.UsageError(
            "haico: --haico-model and --haico-attach exclude each other: a kept stack serves "
            "its own model; give one"
        )
    if settings.backend_image and settings.backend_cmd:
        raise pytest.UsageError(
            "haico: --haico-backend-image and --haico-backend-cmd exclude each other; give one"
        )
    return settings


def parse_served_name(value: Any, source: str) -> str:
    """A served model's catalogue name: an arm's name pattern."""
    text = str(value).strip()
    if not ARM_NAME.match(text):
        raise ConfigError(
            source, "", f"{text!r} is not a served model's name: use [a-z0-9_.] with inner '-'"
        )
    return text
