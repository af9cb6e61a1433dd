"""The experiment as data: arm and script models, and the loaders for their files."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pytest_haico.config.validation import FieldError as _FieldError
from pytest_haico.config.validation import describe_validation_error
from pytest_haico.errors import ConfigError

_M = TypeVar("_M", bound=BaseModel)

ARM_NAME = re.compile(r"^[a-z0-9_.]+(?:-[a-z0-9_.]+)*$")
SCRIPT_ID = re.compile(r"^[a-z0-9_.-]+$")
TAG = re.compile(r"^[a-z_][a-z0-9_]*$")

# Marker names pytest and its usual plugins give a meaning to; a script tag with
# one of these names would silently skip, xfail or parametrise the item.
RESERVED_MARKERS = frozenset(
    {
        "asyncio",
        "filterwarnings",
        "flaky",
        "no_cover",
        "parametrize",
        "skip",
        "skipif",
        "timeout",
        "tryfirst",
        "trylast",
        "usefixtures",
        "xfail",
    }
)

Name = Annotated[str, Field(pattern=SCRIPT_ID.pattern, min_length=1)]
PositiveInt = Annotated[int, Field(ge=1)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelSection(_Section):
    """Which weights the arm serves: a directory, or an HF id + revision from the local cache."""

    path: str | None = None
    hf_id: str | None = None
    revision: str | None = None
    served_name: Name | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if self.path and self.hf_id:
            raise ValueError("give either 'path' or 'hf_id', not both")
        if self.revision and not self.hf_id:
            raise ValueError("'revision' only applies together with 'hf_id'")
        return self


class VllmSection(_Section):
    """How vLLM serves the model."""

    tensor_parallel_size: PositiveInt = 1
    data_parallel_size: PositiveInt = 1
    max_model_len: PositiveInt = 8192
    enable_tool_calling: bool = True
    tool_call_parser: str | None = "hermes"
    extra_args: list[str] = Field(default_factory=list)


class GenerationSection(_Section):
    """Sampling settings the backend passes to the model."""

    max_tokens: PositiveInt = 1024
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 0.0


class AgentSection(_Section):
    """The backend agent's settings."""

    recursion_limit: PositiveInt = 25


class RunSection(_Section):
    """How the campaign drives this arm."""

    concurrency: PositiveInt = 8
    turn_timeout_s: Annotated[float, Field(gt=0)] = 600.0


class SlurmSection(_Section):
    """What `haico submit` asks Slurm for."""

    partition: str | None = None
    gres: str | None = None
    cpus_per_task: PositiveInt | None = None
    mem: str | None = None
    time: str | None = None
    time_per_stratum: dict[str, str] = Field(default_factory=dict)


Persona = Literal["helpful", "looper", "bad_args", "blank", "flaky", "slow", "hang"]


class StandinSection(_Section):
    """How the local profile's stand-ins behave."""

    persona: Persona = "helpful"
    latency_ms: Annotated[int, Field(ge=0)] = 0
    seed: int = 0
    substitute_model: str = ""
    rate_limit_rpm: Annotated[int, Field(ge=0)] = 0
    recursion_flag: bool = True


class BackendSection(_Section):
    """Which backend build serves the arm: an OCI image (by digest) or a SIF."""

    image: str | None = None


class Arm(_Section):
    """One model configuration, from `arms/<name>.toml`."""

    name: str
    description: str = ""
    model: ModelSection = ModelSection()
    vllm: VllmSection = VllmSection()
    generation: GenerationSection = GenerationSection()
    agent: AgentSection = AgentSection()
    run: RunSection = RunSection()
    slurm: SlurmSection | None = None
    standin: StandinSection = StandinSection()
    backend: BackendSection = BackendSection()

    @property
    def served_name(self) -> str:
        return self.model.served_name or self.name


class Expect(_Section):
    """What a turn must produce."""

    artifact: bool | None = None


class Turn(_Section):
    """One user message of a scripted conversation."""

    user: Annotated[str, Field(min_length=1)]
    expect: Expect | None = None
    branch_from: Annotated[int, Field(ge=0)] | None = None


class Script(_Section):
    """One scripted conversation."""

    id: Name
    stratum: Name = "default"
    tags: list[str] = Field(default_factory=list)
    description: str = ""
    repeats: PositiveInt = 1
    turns: Annotated[list[Turn], Field(min_length=1)]

    @model_validator(mode="after")
    def _check(self) -> Script:
        for index, turn in enumerate(self.turns):
            if turn.branch_from is not None and turn.branch_from >= index:
                raise _FieldError(
                    f"turns.{index}.branch_from",
                    f"must name an earlier turn (0..{index - 1}), got {turn.branch_from}"
                    if index
                    else "the first turn cannot branch",
                )
        for position, tag in enumerate(self.tags):
            if not TAG.match(tag):
                raise _FieldError(
                    f"tags.{position}",
                    f"{tag!r} is not a valid marker name: use [a-z0-9_], starting with a letter",
                )
            if tag in RESERVED_MARKERS or tag.startswith("haico"):
                raise _FieldError(
                    f"tags.{position}",
                    f"{tag!r} is one of pytest's own marker names; rename the tag",
                )
        return self


@dataclass(frozen=True)
class ScriptSource:
    """A script and where it came from."""

    script: Script
    path: Path
    position: int
    sha256: str


@dataclass(frozen=True)
class Experiments:
    """Everything under an experiments directory, validated."""

    root: Path
    arms: dict[str, Arm]
    scripts: tuple[ScriptSource, ...]

    @property
    def strata(self) -> frozenset[str]:
        return frozenset(source.script.stratum for source in self.scripts)

    @property
    def tags(self) -> frozenset[str]:
        return frozenset(tag for source in self.scripts for tag in source.script.tags)


def load_experiments(root: Path) -> Experiments:
    """Load and validate `arms/*.toml` and `scripts/*.yaml|*.jsonl` under `root`."""
    arm_files = sorted((root / "arms").glob("*.toml"), key=lambda path: path.stem)
    arms = {path.stem: load_arm(path) for path in arm_files}
    scripts: list[ScriptSource] = []
    seen: dict[str, ScriptSource] = {}
    script_dir = root / "scripts"
    paths = sorted(p for p in script_dir.glob("*") if p.suffix in (".yaml", ".yml", ".jsonl"))
    for path in paths:
        for source in iter_scripts(path):
            earlier = seen.get(source.script.id)
            if earlier is not None:
                raise ConfigError(
                    _where(path, source.position),
                    "id",
                    f"duplicate script id {source.script.id!r}, already defined in "
                    f"{_where(earlier.path, earlier.position)}; script ids must be unique",
                )
            seen[source.script.id] = source
            scripts.append(source)
    return Experiments(root=root, arms=arms, scripts=tuple(scripts))


def load_arm(path: Path) -> Arm:
    """Parse one arm file; the arm's name is the file stem."""
    if not ARM_NAME.match(path.stem):
        raise ConfigError(
            str(path),
            "",
            f"arm name {path.stem!r} (the file stem) is invalid: use [a-z0-9_.] with inner '-'",
        )
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "", f"TOML syntax error: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), "", f"cannot read the arm file: {exc}") from None
    if "name" in document:
        raise ConfigError(str(path), "name", "unknown key: an arm's name is its file stem")
    return _validate(Arm, {**document, "name": path.stem}, str(path))


def iter_scripts(path: Path) -> Iterator[ScriptSource]:
    """Yield the scripts of one YAML (a mapping or a list) or JSONL (a mapping per line) file."""
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), "", f"cannot read the script file: {exc}") from None
    for position, document in _iter_documents(path, text):
        where = _where(path, position)
        if not isinstance(document, dict):
            raise ConfigError(
                where, "", f"expected a mapping with 'id' and 'turns', got {_kind(document)}"
            )
        script = _validate(Script, document, where)
        digest = _sha256_of(document)
        yield ScriptSource(script=script, path=path, position=position, sha256=digest)


def _iter_documents(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    if path.suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    f"{path}:{number}", "", f"JSON syntax error: {exc.msg} (column {exc.colno})"
                ) from None
        return
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{line}", "", f"YAML syntax error: {problem}") from None
    if document is None:
        raise ConfigError(str(path), "", "the file is empty; expected a script mapping or a list")
    if isinstance(document, list):
        yield from enumerate(document, start=1)
    else:
        yield 0, document


def _validate(model: type[_M], document: dict[str, Any], where: str) -> _M:
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        field, problem = describe_validation_error(exc, model)
        raise ConfigError(where, field, problem) from None


def _where(path: Path, position: int) -> str:
    if path.suffix == ".jsonl":
        return f"{path}:{position}"
    return f"{path} (script #{position})" if position else str(path)


def _kind(value: object) -> str:
    return type(value).__name__ if value is not None else "nothing"


def _sha256_of(document: dict[str, Any]) -> str:
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()
