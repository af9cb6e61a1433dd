"""The experiment as data: arm and script models, and the loaders for their files."""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, Field, ValidationError, model_validator

from pytest_haico.config.bounds import (
    ARM_NAME,
    RESERVED_MARKERS,
    TAG,
    Name,
    check_item_count,
    not_blank,
)
from pytest_haico.config.documents import describe_place, is_script_file, iter_documents
from pytest_haico.config.expect import Expect
from pytest_haico.config.limits import (
    MAX_ARM_FILE_BYTES,
    MAX_REPEATS,
    MAX_TAGS,
    MAX_TURN_CHARS,
    MAX_TURNS,
)
from pytest_haico.config.sections import (
    AgentSection,
    BackendSection,
    GenerationSection,
    ModelSection,
    RunSection,
    Section,
    SlurmSection,
    StandinSection,
    VllmSection,
)
from pytest_haico.config.validation import FieldError as _FieldError
from pytest_haico.config.validation import describe_validation_error, human_field
from pytest_haico.errors import ConfigError
from pytest_haico.files import NotAnInputError, read_input_file

_M = TypeVar("_M", bound=BaseModel)


class Arm(Section):
    """One model configuration, from `arms/<name>.toml`."""

    name: str  # the file stem, not a key of the file
    description: str = ""
    """What the arm is, for people; not part of the item identity."""
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


class Turn(Section):
    """One user message of a scripted conversation."""

    user: Annotated[str, Field(min_length=1, max_length=MAX_TURN_CHARS), AfterValidator(not_blank)]
    """The user's message."""
    expect: Expect | None = None
    """What the turn must produce (the `expect` keys below)."""
    branch_from: Annotated[int, Field(ge=0)] | None = None
    """Fork the conversation after an earlier turn, counted from 0 (0: after the first
    turn); unset: go on from the turn before."""


class Script(Section):
    """One scripted conversation."""

    id: Name
    """Unique in the experiments directory; part of the test id."""
    stratum: Name = "default"
    """The cost class: `--haico-stratum`, limits and Slurm times per stratum."""
    tags: Annotated[list[str], Field(max_length=MAX_TAGS)] = Field(default_factory=list)
    """Markers (`-m smoke`) and `-k` keywords: [a-z0-9_], starting with a letter; neither
    an arm's name nor one of pytest's own markers."""
    description: str = ""
    """What the script is, for people."""
    repeats: Annotated[int, Field(ge=1, le=MAX_REPEATS)] = 1
    """How many items the script makes per arm (`-r0`, `-r1`, ...)."""
    turns: Annotated[list[Turn], Field(min_length=1, max_length=MAX_TURNS)]
    """The user's messages, in order (the `turns` keys below)."""

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
