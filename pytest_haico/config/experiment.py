"""The experiment as data: arm and script models, and the loaders for their files."""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from pytest_haico.config.bounds import (
    ARM_NAME,
    DEFAULT_MAX_CONCURRENCY,
    MAX_ARM_FILE_BYTES,
    MAX_CONCURRENCY,
    MAX_CPUS,
    MAX_GPUS,
    MAX_LATENCY_MS,
    MAX_LOAD_S,
    MAX_MODEL_LEN,
    MAX_RATE_LIMIT_RPM,
    MAX_RECURSION_LIMIT,
    MAX_REPEATS,
    MAX_SEED,
    MAX_TAGS,
    MAX_TOKENS,
    MAX_TURN_CHARS,
    MAX_TURN_TIMEOUT_S,
    MAX_TURNS,
    RESERVED_MARKERS,
    TAG,
    ArmConcurrency,
    Finite,
    Name,
    ParserName,
    SlurmTime,
    Text,
    check_item_count,
    not_blank,
)
from pytest_haico.config.documents import describe_place, is_script_file, iter_documents
from pytest_haico.config.expect import Expect
from pytest_haico.config.validation import FieldError as _FieldError
from pytest_haico.config.validation import describe_validation_error, human_field
from pytest_haico.errors import ConfigError
from pytest_haico.files import NotAnInputError, read_input_file

_M = TypeVar("_M", bound=BaseModel)

_MAX_START_TIMEOUT_S = 86_400  # a day: beyond any model load, below a typo's extra 000
# vLLM's start-up log can be silent for half a minute between two lines on a busy node (its
# imports, the engine's own start); two minutes of silence is a hang.
DEFAULT_START_STALL_TIMEOUT_S = 120.0


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelSection(_Section):
    """Which weights the arm serves: a directory, or an HF id + revision from the local cache;
    `served`: found in the catalogue under that name (`haico serve`) instead of started,
    and checked against the other fields."""

    path: Text | None = None
    hf_id: Text | None = None
    revision: Text | None = None
    served_name: Name | None = None
    # Where the model answers, not which model: excluded from model_dump and so from the
    # item_id, so that items against a served model are the items of the same model started
    # by the run (the served model's identity gate makes sure it is that model).
    served: Annotated[str | None, Field(pattern=ARM_NAME.pattern, max_length=128, exclude=True)] = (
        None
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if self.path and self.hf_id:
            raise ValueError("give either 'path' or 'hf_id', not both")
        if self.revision and not self.hf_id:
            raise ValueError("'revision' only applies together with 'hf_id'")
        return self


class VllmSection(_Section):
    """How vLLM serves the model."""

    tensor_parallel_size: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    data_parallel_size: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    max_model_len: Annotated[int, Field(ge=256, le=MAX_MODEL_LEN)] = 8192
    enable_tool_calling: bool = True
    tool_call_parser: ParserName | None = "hermes"
    extra_args: list[Text] = Field(default_factory=list)
    # The wait for vLLM (cluster profile): a large model loads for tens of minutes from a
    # shared file system, so there is no deadline (unless start_timeout_s sets one) while
    # its log advances; the wait ends once its log has said nothing for
    # start_stall_timeout_s. Not result-relevant, so excluded from model_dump and with it
    # from the item_id: raising one after a failed load must not make every finished item
    # new. (run-config has to record them by name.)
    start_timeout_s: Annotated[
        Annotated[float, Field(gt=0, le=_MAX_START_TIMEOUT_S), Finite] | None,
        Field(exclude=True),
    ] = None
    start_stall_timeout_s: Annotated[
        float, Field(gt=0, le=_MAX_START_TIMEOUT_S, exclude=True), Finite
    ] = DEFAULT_START_STALL_TIMEOUT_S

    @model_validator(mode="after")
    def _parser_when_calling_tools(self) -> VllmSection:
        if self.enable_tool_calling and self.tool_call_parser is None:
            raise _FieldError("tool_call_parser", "required while enable_tool_calling is true")
        return self


class GenerationSection(_Section):
    """Sampling settings the backend passes to the model."""

    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] = 1024
    temperature: Annotated[float, Field(ge=0, le=2), Finite] = 0.0


class AgentSection(_Section):
    """The backend agent's settings."""

    recursion_limit: Annotated[int, Field(ge=1, le=MAX_RECURSION_LIMIT)] = 25


class RunSection(_Section):
    """How the campaign drives this arm."""

    concurrency: ArmConcurrency = 8  # or "auto": between 1 and max_concurrency
    max_concurrency: Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)] = DEFAULT_MAX_CONCURRENCY
    turn_timeout_s: Annotated[float, Field(gt=0, le=MAX_TURN_TIMEOUT_S), Finite] = 600.0
    # A short GPU check (gate gpu_check) before vLLM loads; not part of the item identity.
    gpu_check: bool = False
    # The served model (a catalogue name) that scores `expect: {judge: ...}`; --haico-judge
    # overrides it. Not part of the item identity: the judge scores, the arm answers.
    judge: Annotated[str | None, Field(pattern=ARM_NAME.pattern, max_length=128)] = None


class SlurmSection(_Section):
    """What `haico submit` asks Slurm for."""

    partition: Text | None = None
    gres: Text | None = None
    cpus_per_task: Annotated[int, Field(ge=1, le=MAX_CPUS)] | None = None
    mem: Text | None = None
    time: SlurmTime | None = None
    time_per_stratum: dict[Name, SlurmTime] = Field(default_factory=dict)

    def resource_options(self) -> list[str]:
        """The sbatch options for what the arm asks of a node (the time limit apart)."""
        flags = (
            ("--partition", self.partition),
            ("--gres", self.gres),
            ("--cpus-per-task", self.cpus_per_task),
            ("--mem", self.mem),
        )
        return [f"{flag}={setting}" for flag, setting in flags if setting is not None]


Persona = Literal[
    "helpful", "looper", "bad_args", "blank", "flaky", "slow", "hang", "dead", "judge"
]


class StandinSection(_Section):
    """How the local profile's stand-ins behave."""

    persona: Persona = "helpful"
    latency_ms: Annotated[int, Field(ge=0, le=MAX_LATENCY_MS)] = 0
    # Seconds the model server takes to load before it listens, as a real vLLM does.
    load_s: Annotated[float, Field(ge=0, le=MAX_LOAD_S)] = 0
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    substitute_model: str = ""  # "" is documented as "off"
    rate_limit_rpm: Annotated[int, Field(ge=0, le=MAX_RATE_LIMIT_RPM)] = 0
    recursion_flag: bool = True
    # vLLM's --max-num-seqs (its default when unset); more requests wait. Not in the identity.
    max_num_seqs: Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)] | None = None


class BackendSection(_Section):
    """Which backend build serves the arm: an OCI image (by digest) or a SIF."""

    image: Text | None = None


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

    @model_validator(mode="after")
    def _room_for_a_prompt(self) -> Arm:
        limit, tokens = self.vllm.max_model_len, self.generation.max_tokens
        if tokens < limit:
            return self
        if "max_tokens" not in self.generation.model_fields_set:
            raise _FieldError(
                "generation.max_tokens",
                f"the default ({tokens}) leaves no room for a prompt within vllm.max_model_len "
                f"({limit}): set a smaller max_tokens",
            )
        raise _FieldError(
            "generation.max_tokens",
            f"must be below vllm.max_model_len ({limit}), or no prompt fits, got {tokens}",
        )


class Turn(_Section):
    """One user message of a scripted conversation."""

    user: Annotated[str, Field(min_length=1, max_length=MAX_TURN_CHARS), AfterValidator(not_blank)]
    expect: Expect | None = None
    branch_from: Annotated[int, Field(ge=0)] | None = None


class Script(_Section):
    """One scripted conversation."""

    id: Name
    stratum: Name = "default"
    tags: Annotated[list[str], Field(max_length=MAX_TAGS)] = Field(default_factory=list)
    description: str = ""
    repeats: Annotated[int, Field(ge=1, le=MAX_REPEATS)] = 1
    turns: Annotated[list[Turn], Field(min_length=1, max_length=MAX_TURNS)]

    @model_validator(mode="after")
    def _check(self) -> Script:
        for index, turn in enumerate(self.turns):
            if turn.branch_from is not None and turn.branch_from >= index:
                raise _FieldError(
                    f"turns.{index}.branch_from",
                    f"must name an earlier turn, the first being 0 (0..{index - 1} here), "
                    f"got {turn.branch_from}"
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
    line: int | None = None

    @property
    def where(self) -> str:
        """The file, with the line and the position (from 1) of the script where known."""
        return describe_place(self.path, self.position, self.line)


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
    """Load and validate `arms/*.toml` and `scripts/*.yaml|*.yml|*.json|*.jsonl` under `root`."""
    arm_files = sorted((root / "arms").glob("*.toml"), key=lambda path: path.stem)
    arms = {path.stem: load_arm(path) for path in arm_files}
    scripts: list[ScriptSource] = []
    seen: dict[str, ScriptSource] = {}
    for path in sorted(p for p in (root / "scripts").glob("*") if is_script_file(p)):
        for source in iter_scripts(path):
            earlier = seen.get(source.script.id)
            if earlier is not None:
                raise ConfigError(
                    source.where,
                    "id",
                    f"duplicate script id {source.script.id!r}, already defined in "
                    f"{earlier.where}; script ids must be unique",
                )
            _check_tags_are_not_arms(source, arms, root)
            seen[source.script.id] = source
            scripts.append(source)
    check_item_count(root, len(arms), sum(source.script.repeats for source in scripts))
    return Experiments(root=root, arms=arms, scripts=tuple(scripts))


def _check_tags_are_not_arms(source: ScriptSource, arms: dict[str, Arm], root: Path) -> None:
    """`-k <arm>` is how arms are picked; a tag of that name would pick the script everywhere."""
    for position, tag in enumerate(source.script.tags):
        if tag in arms:
            raise ConfigError(
                source.where,
                human_field(["tags", position]),
                f"{tag!r} is also the name of arm {tag!r} ({root / 'arms' / tag}.toml): "
                f"-k {tag} would select this script in every arm; rename the tag",
            )


def load_arm(path: Path) -> Arm:
    """Parse one arm file; the arm's name is the file stem."""
    if not ARM_NAME.match(path.stem):
        raise ConfigError(
            str(path),
            "",
            f"arm name {path.stem!r} (the file stem) is invalid: use [a-z0-9_.] with inner '-'",
        )
    try:
        text = read_input_file(path, max_bytes=MAX_ARM_FILE_BYTES).decode("utf-8")
        document = tomllib.loads(text)
    except NotAnInputError as exc:
        raise ConfigError(
            str(path),
            "",
            f"the arm file {exc.problem}: make it a regular TOML file",
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "", f"TOML syntax error: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), "", f"cannot read the arm file: {exc}") from None
    if not document:
        raise ConfigError(
            str(path), "", 'the arm file sets no key: write at least description = "..."'
        )
    if "name" in document:
        raise ConfigError(str(path), "name", "unknown key: an arm's name is its file stem")
    return _validate(Arm, {**document, "name": path.stem}, str(path))


def iter_scripts(path: Path) -> Iterator[ScriptSource]:
    """The scripts of one file: YAML or JSON (a mapping or a list), JSONL (a mapping a line)."""
    for position, line, document in iter_documents(path):
        where = describe_place(path, position, line)
        if not isinstance(document, dict):
            raise ConfigError(
                where, "", f"expected a mapping with 'id' and 'turns', got {_kind(document)}"
            )
        script = _validate(Script, document, where)
        digest = _sha256_of(document)
        yield ScriptSource(script=script, path=path, position=position, sha256=digest, line=line)


def _validate(model: type[_M], document: dict[str, Any], where: str) -> _M:
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        field, problem = describe_validation_error(exc, model)
        raise ConfigError(where, field, problem) from None


def _kind(value: object) -> str:
    return type(value).__name__ if value is not None else "nothing"


def _sha256_of(document: dict[str, Any]) -> str:
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()
