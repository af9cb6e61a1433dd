"""Option resolution (CLI > env > ini > default) into one frozen `Settings`."""

from __future__ import annotations

import enum
import os
import shlex
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pytest_haico.config.cluster_env import ClusterEnv, load_cluster_env
from pytest_haico.config.item_list import ItemList, parse_item_list
from pytest_haico.errors import ConfigError

_T = TypeVar("_T")

# The already-served model's API key (--haico-model-endpoint): from the environment only,
# since argv and ini files are readable by others.
MODEL_API_KEY_ENV = "HAICO_MODEL_API_KEY"


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
class Shard:
    """Task `index` of `count`: the items whose item_id falls in this share."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class Option:
    """One `--haico-*` option: its help, how it parses, its default."""

    noun: str
    help: str
    metavar: str | None = None
    flag: bool = False
    repeatable: bool = False

    @property
    def cli(self) -> str:
        return "--haico-" + self.noun.replace("_", "-")

    @property
    def dest(self) -> str:
        return "haico_" + self.noun

    @property
    def env(self) -> str:
        return "PYTEST_HAICO_" + self.noun.upper()


OPTIONS = (
    Option(
        "profile",
        "which stack to start: local (the default: stand-ins) or cluster (vLLM from "
        "$VLLM_VENV, Postgres and the backend from images; README: the cluster profile)",
        "local|cluster",
    ),
    Option(
        "results", "results root (default: $CLUSTER_WORK/results, else <rootdir>/results)", "DIR"
    ),
    Option("campaign", "campaign directory under the results root (default: default)", "NAME"),
    Option("experiments", "where arms/ and scripts/ are (default: <rootdir>/experiments)", "DIR"),
    Option("cluster_env", "site settings file (default: <experiments>/cluster.env)", "FILE"),
    Option("arm", "run only this arm (exact name; repeatable)", "NAME", repeatable=True),
    Option("stratum", "run only this stratum (exact name; repeatable)", "NAME", repeatable=True),
    Option("limit_per_stratum", "at most N items per arm x stratum (the smoke stage)", "N"),
    Option("shard", "this run's share I/N of the items (required inside a job array)", "I/N"),
    Option(
        "items",
        "run only the items listed in FILE (test ids such as qwen32b-plan-trip-r0, one per "
        "line; with --haico-shard I/N the file's items I, I+N, I+2N, ... in file order)",
        "FILE",
    ),
    Option("concurrency", "conversations in flight per arm (default: the arm's)", "N"),
    Option("no_resume", "rerun items that already have a terminal record", flag=True),
    Option("max_attempts", "infra-failed attempts before gave_up (default: 3)", "N"),
    Option(
        "drain_timeout",
        "grace in seconds for in-flight conversations after SIGUSR1 (default 120)",
        "S",
    ),
    Option(
        "dump_interval",
        "seconds between periodic pg_dumps of the backend database; 0: final dump only "
        "(default 900)",
        "S",
    ),
    Option("exit", "exit-code semantics: strict (default) or campaign", "strict|campaign"),
    Option(
        "gates_only",
        "run each selected arm's preflight gates (its stack started and stopped), print the "
        "table and run no item: exit 0 when all passed, 78 otherwise",
        flag=True,
    ),
    Option(
        "backend_image",
        "cluster profile: run the backend from this image (docker://<repo>@sha256:<digest>, "
        "its SIF pulled to SIF_DIR, or a .sif path) instead of the arm's or cluster.env's",
        "REF",
    ),
    Option(
        "backend_cmd",
        "run the backend from this command (a build under test) instead of the stand-in; "
        "{port} in it is replaced by its port (README: the backend's environment)",
        "CMD",
    ),
    Option(
        "model_endpoint",
        "use a model server that already runs (its OpenAI base URL, e.g. "
        "http://vllm.localhost:8000/v1; key from $HAICO_MODEL_API_KEY) instead of starting one",
        "URL",
    ),
    Option(
        "progress",
        "per-item output: auto (the default: a line per finished conversation, with ETA, when "
        "the output is not a terminal; pytest's dots on one), lines (always), off (pytest's "
        "own); -q and -v always give pytest's own",
        "auto|lines|off",
    ),
    Option("attach", "use the stack `haico stack up` keeps (its state file)", "FILE"),
    Option(
        "results_mode",
        "mode of the files written under the results root, directories get x where r is set "
        "(default: 0640)",
        "MODE",
    ),
)


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
    concurrency: int | None
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
    attach: Path | None
    results_mode: int
    sources: Mapping[str, str]


def add_options(parser: pytest.Parser) -> None:
    """Register every option in one `haico` group, each also an ini key."""
    group = parser.getgroup("haico", "pytest-haico: scripted LLM conversation campaigns")
    for option in OPTIONS:
        if option.flag:
            group.addoption(
                option.cli, action="store_true", default=None, dest=option.dest, help=option.help
            )
            parser.addini(option.dest, option.help, type="bool", default=None)
        elif option.repeatable:
            group.addoption(
                option.cli,
                action="append",
                default=None,
                dest=option.dest,
                metavar=option.metavar,
                help=option.help,
            )
            parser.addini(option.dest, option.help, type="args", default=None)
        else:
            group.addoption(
                option.cli, default=None, dest=option.dest, metavar=option.metavar, help=option.help
            )
            parser.addini(option.dest, option.help, type="string", default=None)


class _Resolver:
    """Looks a knob up in CLI, env and ini order and remembers where each value came from."""

    def __init__(self, config: pytest.Config, environ: Mapping[str, str]) -> None:
        self.config = config
        self.environ = environ
        self.sources: dict[str, str] = {}

    def raw(self, option: Option) -> tuple[Any, str] | None:
        value = self.config.getoption(option.dest)
        if value is not None:
            return value, option.cli
        if option.env in self.environ and self.environ[option.env] != "":
            env_value: Any = self.environ[option.env]
            if option.repeatable:
                env_value = [part for part in env_value.split(",") if part]
            elif option.flag:
                env_value = _parse_bool(env_value, f"environment variable {option.env}")
            return env_value, f"environment variable {option.env}"
        ini_value = self.config.getini(option.dest)
        if ini_value is not None and ini_value != [] and ini_value != "":
            return ini_value, f"ini option {option.dest}"
        return None

    def get(self, noun: str, parse: Callable[[Any, str], _T], default: _T) -> _T:
        option = _BY_NOUN[noun]
        found = self.raw(option)
        if found is None:
            self.sources[noun] = "default"
            return default
        value, source = found
        self.sources[noun] = source
        return parse(value, source)

    def given(self, noun: str) -> bool:
        return self.sources.get(noun, "default") != "default"


_BY_NOUN = {option.noun: option for option in OPTIONS}


def resolve_settings(config: pytest.Config, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve every option; a bad value is a `pytest.UsageError` naming its source."""
    env = os.environ if environ is None else environ
    r = _Resolver(config, env)
    rootdir = Path(config.rootpath)
    here = Path(config.invocation_params.dir)

    def path_from(value: Any, source: str) -> Path:
        base = rootdir if source.startswith("ini") else here
        return (base / str(value)).resolve()

    experiments = r.get("experiments", path_from, rootdir / "experiments")
    experiments_given = r.given("experiments")
    default_cluster_env = experiments / "cluster.env"
    cluster_env = r.get(
        "cluster_env", path_from, default_cluster_env if default_cluster_env.is_file() else None
    )
    site = _load_site(cluster_env)
    # $CLUSTER_WORK of the environment wins over the site file's: it is what a shell sees.
    cluster_work = env.get("CLUSTER_WORK") or (site.get("CLUSTER_WORK") if site else None)
    default_results = Path(cluster_work) / "results" if cluster_work else rootdir / "results"
    shard = r.get("shard", parse_shard, Shard(0, 1))
    items_file = r.get("items", path_from, None)
    settings = Settings(
        profile=r.get("profile", _enum_parser(Profile), Profile.LOCAL),
        results=r.get("results", path_from, default_results),
        campaign=r.get("campaign", _parse_name, "default"),
        experiments=experiments,
        experiments_given=experiments_given,
        cluster_env=cluster_env,
        site=site,
        arms=tuple(r.get("arm", _parse_names, [])),
        strata=tuple(r.get("stratum", _parse_names, [])),
        limit_per_stratum=r.get("limit_per_stratum", _int_parser(minimum=1), None),
        shard=shard,
        shard_given=r.given("shard"),
        items_file=items_file,
        items=_load_items(items_file),
        concurrency=r.get("concurrency", _int_parser(minimum=1), None),
        resume=not r.get("no_resume", _parse_bool, False),
        max_attempts=r.get("max_attempts", _int_parser(minimum=1), 3),
        drain_timeout=r.get("drain_timeout", _float_parser(minimum=0.0), 120.0),
        dump_interval=r.get("dump_interval", _float_parser(minimum=0.0), 900.0),
        exit_mode=r.get("exit", _enum_parser(ExitMode), ExitMode.STRICT),
        progress=r.get("progress", _enum_parser(ProgressMode), ProgressMode.AUTO),
        gates_only=r.get("gates_only", _parse_bool, False),
        backend_image=r.get("backend_image", _parse_text, None),
        backend_cmd=r.get("backend_cmd", _parse_command, None),
        backend_cmd_dir=here,
        model_endpoint=r.get("model_endpoint", _parse_endpoint, None),
        model_api_key=env.get(MODEL_API_KEY_ENV) or None,
        attach=r.get("attach", path_from, None),
        results_mode=r.get("results_mode", parse_results_mode, 0o640),
        sources=dict(r.sources),
    )
    if settings.backend_image and settings.backend_cmd:
        raise pytest.UsageError(
            "haico: --haico-backend-image and --haico-backend-cmd exclude each other; give one"
        )
    return settings


def _load_site(path: Path | None) -> ClusterEnv | None:
    if path is None:
        return None
    try:
        return load_cluster_env(path)
    except ConfigError as exc:
        raise pytest.UsageError(f"haico: {exc}") from None


def _load_items(path: Path | None) -> ItemList | None:
    if path is None:
        return None
    try:
        return parse_item_list(path)
    except ConfigError as exc:
        raise pytest.UsageError(f"haico: {exc}") from None


def parse_shard(value: Any, source: str) -> Shard:
    """`I/N` with 0 <= I < N."""
    text = str(value).strip()
    index_text, slash, count_text = text.partition("/")
    try:
        index, count = int(index_text), int(count_text)
    except ValueError:
        index, count = -1, 0
    if not slash or count < 1 or index < 0:
        raise pytest.UsageError(
            f"haico: {source}: invalid shard {text!r}; expected I/N with 0 <= I < N, e.g. 0/4"
        )
    if index >= count:
        raise pytest.UsageError(
            f"haico: {source}: invalid shard {text!r}: the index must be below N "
            f"(0..{count - 1}); shards count from 0"
        )
    return Shard(index, count)


def parse_results_mode(value: Any, source: str) -> int:
    """An octal file mode (`0640`, `644`, `0o600`) with r/w bits only, that the owner can read
    and write and nobody else can write."""
    text = str(value).strip()
    digits = text.removeprefix("0o").removeprefix("0O") or "0"
    problem = None
    try:
        mode = int(digits, 8)
    except ValueError:
        mode, problem = 0, "not an octal number"
    if problem is None:
        if mode & ~0o666:
            problem = "a file mode has r and w bits only (no x, setuid, setgid or sticky bit)"
        elif mode & 0o022:
            problem = "group or others could write, and so change the ledger"
        elif mode & 0o600 != 0o600:
            problem = "the owner must be able to read and write"
    if problem is not None:
        raise pytest.UsageError(
            f"haico: {source}: invalid results mode {text!r}: {problem}; give an octal file "
            "mode such as 0640 (the default: the group may read) or 0644 (everyone may read)"
        )
    return mode


def _parse_bool(value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise pytest.UsageError(f"haico: {source}: expected a boolean (1/0, true/false), got {value!r}")


def _int_parser(*, minimum: int) -> Callable[[Any, str], int]:
    def parse(value: Any, source: str) -> int:
        try:
            number = int(str(value).strip())
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise pytest.UsageError(
                f"haico: {source}: expected an integer >= {minimum}, got {value!r}"
            )
        return number

    return parse


def _float_parser(*, minimum: float) -> Callable[[Any, str], float]:
    def parse(value: Any, source: str) -> float:
        try:
            number = float(str(value).strip())
        except ValueError:
            number = minimum - 1
        if not number >= minimum:
            raise pytest.UsageError(
                f"haico: {source}: expected a number of seconds >= {minimum:g}, got {value!r}"
            )
        return number

    return parse


def _enum_parser(kind: type[enum.StrEnum]) -> Callable[[Any, str], Any]:
    def parse(value: Any, source: str) -> Any:
        try:
            return kind(str(value).strip())
        except ValueError:
            valid = ", ".join(member.value for member in kind)
            raise pytest.UsageError(
                f"haico: {source}: invalid value {value!r}; valid: {valid}"
            ) from None

    return parse


def _parse_command(value: Any, source: str) -> str:
    """A command line as a shell would split it (it runs without a shell)."""
    text = _parse_text(value, source)
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise pytest.UsageError(f"haico: {source}: cannot split {text!r}: {exc}") from None
    if not words:
        raise pytest.UsageError(f"haico: {source}: must name a program")
    return text


def _parse_endpoint(value: Any, source: str) -> str:
    """An OpenAI-compatible base URL: http(s), a host, a port, no credentials or query."""
    text = _parse_text(value, source).rstrip("/")
    url = urllib.parse.urlsplit(text)
    problem = None
    if url.scheme not in ("http", "https"):
        problem = "use http:// or https://"
    elif not url.hostname:
        problem = "it names no host"
    elif url.username or url.password:
        problem = f"no credentials in the URL: the key goes in ${MODEL_API_KEY_ENV}"
    elif url.query or url.fragment:
        problem = "no query or fragment"
    if problem is not None:
        raise pytest.UsageError(
            f"haico: {source}: {text!r} is not a model server's base URL ({problem}); "
            "e.g. http://vllm.localhost:8000/v1"
        )
    return text


def _parse_text(value: Any, source: str) -> str:
    text = str(value).strip()
    if not text:
        raise pytest.UsageError(f"haico: {source}: must not be empty")
    return text


def _parse_name(value: Any, source: str) -> str:
    text = str(value).strip()
    if not text or "/" in text or text.startswith("."):
        raise pytest.UsageError(
            f"haico: {source}: invalid name {value!r}; use a plain directory name"
        )
    return text


def _parse_names(value: Any, source: str) -> list[str]:
    names = [str(part).strip() for part in value]
    if not all(names):
        raise pytest.UsageError(f"haico: {source}: empty name in {value!r}")
    return names
