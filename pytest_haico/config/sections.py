"""The arm file's sections (`[model]`, `[vllm]`, ...) and the stand-in personas it may name.

Each field's docstring is its description in the arm reference (`config/reference.py`).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pytest_haico.config.bounds import (
    ARM_NAME,
    ArmConcurrency,
    Finite,
    Name,
    ParserName,
    SlurmTime,
    Text,
)
from pytest_haico.config.limits import (
    DEFAULT_MAX_CONCURRENCY,
    MAX_CONCURRENCY,
    MAX_CPUS,
    MAX_GPUS,
    MAX_LATENCY_MS,
    MAX_LOAD_S,
    MAX_MODEL_LEN,
    MAX_RATE_LIMIT_RPM,
    MAX_RECURSION_LIMIT,
    MAX_SEED,
    MAX_TOKENS,
    MAX_TURN_TIMEOUT_S,
)
from pytest_haico.config.pass_rule import parse_pass_rule
from pytest_haico.config.validation import FieldError as _FieldError

_MAX_START_TIMEOUT_S = 86_400  # a day: beyond any model load, below a typo's extra 000
# vLLM's start-up log can be silent for half a minute between two lines on a busy node (its
# imports, the engine's own start); two minutes of silence is a hang.
DEFAULT_START_STALL_TIMEOUT_S = 120.0


class Section(BaseModel):
    """A part of an arm or a script: unknown keys refused, values not coerced."""

    # The docstrings under the fields are read by the reference (`config.reference`), not
    # at import: pydantic's use_attribute_docstrings reads each model's source at every start.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelSection(Section):
    """Which weights the arm serves: a directory, or an HF id + revision from the local cache;
    `served`: found in the catalogue under that name (`haico serve`) instead of started,
    and checked against the other fields."""

    path: Text | None = None
    """The model's directory (cluster profile); not together with `hf_id`."""
    hf_id: Text | None = None
    """A Hugging Face model id, loaded from the local cache."""
    revision: Text | None = None
    """The `hf_id`'s revision (commit); only with `hf_id`."""
    served_name: Name | None = None
    """The name the model is served under (default: the arm's name)."""
    # Where the model answers, not which model: excluded from model_dump and so from the
    # item_id, so that items against a served model are the items of the same model started
    # by the run (the served model's identity gate makes sure it is that model).
    served: Annotated[str | None, Field(pattern=ARM_NAME.pattern, max_length=128, exclude=True)] = (
        None
    )
    """A model already served by `haico serve`, by its catalogue name, used instead of
    starting one; not part of the item identity."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if self.path and self.hf_id:
            raise ValueError("give either 'path' or 'hf_id', not both")
        if self.revision and not self.hf_id:
            raise ValueError("'revision' only applies together with 'hf_id'")
        return self


class VllmSection(Section):
    """How vLLM serves the model."""

    tensor_parallel_size: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    """vLLM's `--tensor-parallel-size`: GPUs one model copy spans."""
    data_parallel_size: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    """vLLM's `--data-parallel-size`: model copies on the node."""
    max_model_len: Annotated[int, Field(ge=256, le=MAX_MODEL_LEN)] = 8192
    """vLLM's `--max-model-len`: prompt and answer tokens together; above
    `generation.max_tokens`."""
    enable_tool_calling: bool = True
    """Whether vLLM parses tool calls (`--enable-auto-tool-choice`)."""
    tool_call_parser: ParserName | None = "hermes"
    """vLLM's `--tool-call-parser` (hermes, mistral, llama3_json, ...); required while
    `enable_tool_calling` is true."""
    extra_args: list[Text] = Field(default_factory=list)
    """More arguments for `vllm serve`, one per item."""
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
    """Seconds vLLM may take to start at most (unset: no deadline while its log advances);
    not part of the item identity."""
    start_stall_timeout_s: Annotated[
        float, Field(gt=0, le=_MAX_START_TIMEOUT_S, exclude=True), Finite
    ] = DEFAULT_START_STALL_TIMEOUT_S
    """Seconds of silence in vLLM's start-up log that count as a hang; not part of the
    item identity."""

    @model_validator(mode="after")
    def _parser_when_calling_tools(self) -> VllmSection:
        if self.enable_tool_calling and self.tool_call_parser is None:
            raise _FieldError("tool_call_parser", "required while enable_tool_calling is true")
        return self


class GenerationSection(Section):
    """Sampling settings the backend passes to the model."""

    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] = 1024
    """The most tokens one model answer may have; below `vllm.max_model_len`."""
    temperature: Annotated[float, Field(ge=0, le=2), Finite] = 0.0
    """Sampling temperature (0: greedy)."""


class AgentSection(Section):
    """The backend agent's settings."""

    recursion_limit: Annotated[int, Field(ge=1, le=MAX_RECURSION_LIMIT)] = 25
    """The most agent steps one turn may take (LangGraph's recursion limit)."""


class RunSection(Section):
    """How the campaign drives this arm."""

    concurrency: ArmConcurrency = 8
    """Conversations in flight at once, or "auto": from 1 up to `max_concurrency`, as the
    stack keeps up."""
    max_concurrency: Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)] = DEFAULT_MAX_CONCURRENCY
    """The upper bound of `concurrency = "auto"`."""
    turn_timeout_s: Annotated[float, Field(gt=0, le=MAX_TURN_TIMEOUT_S), Finite] = 600.0
    """Seconds one turn may take before it fails as a timeout."""
    gpu_check: bool = False
    """Run a short GPU check (gate gpu_check) before vLLM loads; not part of the item
    identity."""
    judge: Annotated[str | None, Field(pattern=ARM_NAME.pattern, max_length=128)] = None
    """The served model (a catalogue name) that scores `expect: {judge: ...}`;
    `--haico-judge` overrides it. Not part of the item identity."""
    pass_rule: Annotated[str, Field(max_length=32)] | None = None
    """How a script's repeats make one verdict for `haico compare` and `haico validate`:
    "all", "any", "majority" or "k_of_n:K/N" (at least K of the N repeats pass); unset: each
    repeat counts on its own. Recorded in run-config; not part of the item identity."""

    @model_validator(mode="after")
    def _known_pass_rule(self) -> RunSection:
        if self.pass_rule is not None:
            try:
                parse_pass_rule(self.pass_rule)
            except ValueError as exc:
                raise _FieldError("pass_rule", str(exc)) from None
        return self


class SlurmSection(Section):
    """What `haico submit` asks Slurm for."""

    partition: Text | None = None
    """sbatch `--partition`."""
    gres: Text | None = None
    """sbatch `--gres`, e.g. "gpu:1"."""
    cpus_per_task: Annotated[int, Field(ge=1, le=MAX_CPUS)] | None = None
    """sbatch `--cpus-per-task`."""
    mem: Text | None = None
    """sbatch `--mem`, e.g. "64G"."""
    time: SlurmTime | None = None
    """sbatch `--time` of each job (default: from the cost model)."""
    time_per_stratum: dict[Name, SlurmTime] = Field(default_factory=dict)
    """sbatch `--time` per stratum: a table of stratum = time."""

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
# What each persona of the stand-in model (`standins/personas.py`) does: the one description,
# rendered in the arm reference. A guided request (a named or "required" tool_choice) gets
# a valid tool call from every persona but dead, as vLLM's guided decoding guarantees.
PERSONAS: dict[Persona, str] = {
    "helpful": "answers each turn in a sentence about it; calls a tool when the turn asks "
    "for an artifact (document, write, file, report, draft, save), then reports its result",
    "looper": "calls one of the offered tools at every step, never answering while tools are "
    "offered, until the agent's recursion limit stops the turn",
    "bad_args": "calls a tool with arguments that break the tool's schema (with no tools "
    "offered, answers as helpful)",
    "blank": "answers with neither text nor a tool call",
    "flaky": "answers half of the requests with HTTP 500, chosen by seed and messages, so "
    "a conversation fails at the same turn every time",
    "slow": "answers as helpful, 1 s later (on top of `latency_ms`)",
    "hang": "answers a conversation's first request as helpful and holds every later one "
    "until the client goes away: it passes the gates, and its conversations time out",
    "dead": "answers its first request with an empty HTTP 500, then its server exits",
    "judge": 'a judge model: answers "Yes." when the answer judged contains every phrase the '
    'question quotes in double quotes, else "No."',
}


class StandinSection(Section):
    """How the local profile's stand-ins behave."""

    persona: Persona = "helpful"
    """How the stand-in model answers (the personas below)."""
    latency_ms: Annotated[int, Field(ge=0, le=MAX_LATENCY_MS)] = 0
    """Milliseconds the stand-in model waits before each answer."""
    load_s: Annotated[float, Field(ge=0, le=MAX_LOAD_S)] = 0
    """Seconds the model server takes to load before it listens, as a real vLLM does."""
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    """The stand-in model's only source of chance, with the messages."""
    substitute_model: str = ""
    """A model id the stand-in backend records in its snapshots instead of the one asked
    for ("" is off)."""
    blank_on: Annotated[str, Field(max_length=256)] = ""
    """A regular expression: a conversation with a user turn it matches gets blank answers
    (as persona blank) whatever the persona, so a known set of scripts fails ("" is off)."""
    rate_limit_rpm: Annotated[int, Field(ge=0, le=MAX_RATE_LIMIT_RPM)] = 0
    """Queries per minute the stand-in backend allows before it answers 429 (0: no limit)."""
    recursion_flag: bool = True
    """Whether the stand-in backend reports a reached recursion limit (false: never)."""
    max_num_seqs: Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)] | None = None
    """vLLM's `--max-num-seqs` (unset: its default); more requests wait. Not part of the
    item identity."""

    @model_validator(mode="after")
    def _blank_on_compiles(self) -> StandinSection:
        try:
            re.compile(self.blank_on)
        except re.error as exc:
            raise _FieldError("blank_on", f"not a regular expression: {exc}") from None
        return self


class BackendSection(Section):
    """Which backend build serves the arm: an OCI image (by digest) or a SIF."""

    image: Text | None = None
    """The backend's image, `docker://...@sha256:...`; `--haico-backend-image` wins."""
