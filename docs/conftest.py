"""The documentation's console examples as tests (Sybil): each ```console block that a
`<!-- console: checked -->` line precedes runs its commands in a home of its own and
compares what they print (tests/docs/console.py says how, and what is masked).
`<!-- console: checked in a new project -->` gives the block a home of its own and first runs
`haico init project && cd project && pytest -q` there, so that it starts in `~/project`, a
campaign with results. The other blocks of a page share one home and directory, in page
order. They start processes (a campaign takes a
few seconds), so they are marked slow."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sybil import Document, Example, Region, Sybil
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

from tests.docs import console

DIRECTIVE = re.compile(r"<!-- console: checked( in a new project)? -->\n\s*\Z")
NEW_PROJECT = "haico init project && cd project && pytest -q > /dev/null"


class ConsoleParser:
    """The ```console blocks whose directive says they are checked."""

    def __init__(self) -> None:
        self.lexer = FencedCodeBlockLexer(language="console")

    def __call__(self, document: Document) -> Iterator[Region]:
        for region in self.lexer(document):
            directive = DIRECTIVE.search(document.text[: region.start])
            if directive is None:
                continue
            yield Region(
                region.start,
                region.end,
                (bool(directive.group(1)), str(region.lexemes["source"])),
                evaluate_block,
            )


def evaluate_block(example: Example) -> str | None:
    new_project, source = example.parsed
    namespace = example.namespace
    home: Path = namespace["home"]
    cwd: Path = namespace["cwd"]
    if new_project:
        home = _new_home(namespace)
        setup = console.Command(NEW_PROJECT, ["..."], 0)
        cwd, problem = console.run(setup, home=home, cwd=home)
        if problem:
            return f"the new project did not run:\n{problem}"
    for command in console.parse_block(source):
        cwd, problem = console.run(command, home=home, cwd=cwd)
        if problem:
            return problem
    if not new_project:
        namespace["cwd"] = cwd
    return None


def _new_home(namespace: dict[str, Any]) -> Path:
    # Short: a path in a page's output is its home's, shown as `~`.
    home = Path(tempfile.mkdtemp(prefix="haico-docs-"))
    home.chmod(0o711)  # the stand-ins' Postgres runs as another user when we are root
    namespace["homes"].append(home)
    # Where a page's reader has their clone: `~/pytest-haico` in a command is this one.
    (home / console.SHOWN_CLONE.removeprefix("~/")).symlink_to(console.CLONE)
    (home / console.TMPDIR).mkdir()
    (home / console.TMPDIR).chmod(0o711)
    return home


def _setup(namespace: dict[str, Any]) -> None:
    namespace["homes"] = []
    home = _new_home(namespace)
    namespace.update(home=home, cwd=home)


def _teardown(namespace: dict[str, Any]) -> None:
    for home in namespace["homes"]:
        console.stop_kept_stacks(home)
        shutil.rmtree(home, ignore_errors=True)


pytest_collect_file = Sybil(
    parsers=[ConsoleParser()], patterns=["*.md"], setup=_setup, teardown=_teardown
).pytest()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    docs = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(docs):
            item.add_marker("subprocess")
            item.add_marker("slow")
