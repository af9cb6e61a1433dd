"""The `--haico-*` options: their table, and their registration with pytest (each also an
ini key)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest


@dataclass(frozen=True)
class Option:
    """One `--haico-*` option: its noun (which names its flag, ini key and environment
    variable), its help, and whether it is a flag or repeatable."""

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
        "$VLLM_VENV, Postgres and the backend from images; docs: The cluster profile)",
        "local|cluster",
    ),
    Option(
        "results", "results root (default: $CLUSTER_WORK/results, else <rootdir>/results)", "DIR"
    ),
    Option(
        "catalogue",
        "where served models register and are found by name (default: $CLUSTER_WORK/catalogue, "
        "else <rootdir>/catalogue); haico submit gives its jobs the one it resolved",
        "DIR",
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
    Option(
        "concurrency",
        "conversations in flight per arm, or auto: adapt to the model's load between 1 and the "
        "arm's max_concurrency (default: the arm's run.concurrency)",
        "N|auto",
    ),
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
        "{port} in it is replaced by its port (docs: Check a backend change)",
        "CMD",
    ),
    Option(
        "model_endpoint",
        "use a model server that already runs (its OpenAI base URL, e.g. "
        "http://vllm.localhost:8000/v1; key from $HAICO_MODEL_API_KEY) instead of starting one",
        "URL",
    ),
    Option(
        "model",
        "use the model served under this name in the catalogue (`haico serve`), resolved at "
        "the start of every run, instead of starting one (as an arm's [model] served)",
        "NAME",
    ),
    Option(
        "judge",
        "the served model (a catalogue name, `haico serve`) that scores scripts' "
        "`expect: {judge: ...}`, for every arm (as an arm's [run] judge)",
        "NAME",
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


BY_NOUN = {option.noun: option for option in OPTIONS}


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


def describe_unknown_options(unknown: Iterable[str]) -> str | None:
    """The refusal of a `--haico-*` word that names no option (`--haico-limt=2`), with the
    nearest of the plugin's options; None when every word is known (pytest refuses the
    other unknown words its own way)."""
    known = {option.cli for option in OPTIONS}
    for word in unknown:
        name = word.split("=", 1)[0]
        if not name.startswith("--haico-") or name in known:
            continue
        close = nearest_option(name)
        hint = f"did you mean {close}?" if close else "no haico option is close to it;"
        return (
            f"haico: unrecognized option {name}: {hint} `pytest --help` lists the haico "
            "options under 'pytest-haico'"
        )
    return None


def nearest_option(name: str) -> str | None:
    """The option a misspelled `--haico-*` name most likely meant: its noun against each
    option's noun, and against as many of that noun's first words (`--haico-limt` is
    `--haico-limit-per-stratum` cut short and misspelled)."""
    typed = name.removeprefix("--haico-")
    words = typed.count("-") + 1
    scored = []
    for option in OPTIONS:
        noun = option.noun.replace("_", "-")
        head = "-".join(noun.split("-")[:words])
        whole = difflib.SequenceMatcher(None, typed, noun).ratio()
        cut = difflib.SequenceMatcher(None, typed, head).ratio()
        # A tie on the first words goes to the option that is those words alone.
        scored.append((max(whole, cut), whole, option.cli))
    score, _, best = max(scored)
    return best if score >= 0.6 else None  # difflib's own cutoff for a close match
