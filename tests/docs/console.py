"""Running a documentation page's console example and comparing what it prints.

A ```console block is a list of `$ command` lines, each followed by what it prints. It is
run with bash in a home of its own (`HOME`, so `~/` in the page is that home; this clone is
shown as, and reachable at, `~/pytest-haico`; `TMPDIR` is `~/tmp`), with this environment's
`pytest` and `haico` first on PATH, and compared line by line after masking what changes
from run to run in both texts (`mask`): durations, percentages, run ids and dates, hashes.
A line `...` stands for any lines, and `...` inside a line for any text of it; a last line
`(exit N)` is the command's exit status, otherwise it must exit 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ELLIPSIS = "..."
# This clone, where the page's reader has theirs.
CLONE = Path(__file__).resolve().parents[2]
SHOWN_CLONE = "~/pytest-haico"
# A home's $TMPDIR, relative to it.
TMPDIR = "tmp"
# Seconds a command of a page may take (a campaign on the stand-ins takes a few).
COMMAND_TIMEOUT_S = 120
# What changes from one run to the next, masked alike in the page and the output.
_VARIABLE = (
    (re.compile(r"\d{8}T\d{6}Z-\d+(\.\d+)*"), "<run>"),
    (re.compile(r"\d{8}T\d{6}Z"), "<stamp>"),
    (re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}( UTC)?"), "<time>"),
    (re.compile(r"\b[0-9a-f]{12,64}\b"), "<hash>"),
    (
        re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|min|h|m|s)\b(?: \d+(?:\.\d+)? ?(?:ms|m|s)\b)*"),
        "<duration>",
    ),
    (re.compile(r"\b\d+(\.\d+)?s\b"), "<duration>"),
    (re.compile(r"\b\d+(\.\d+)?%"), "<share>"),
)
_EXIT = re.compile(r"^\(exit (\d+)\)$")
# A command whose input follows it, as a here-document (`cat > file <<'EOF'`).
_HERE_DOCUMENT = re.compile(r"<<-?'?(\w+)'?\s*$")
# The environment a reader's shell would not have: this session's own settings.
_DROPPED = ("PYTEST_ADDOPTS", "PYTEST_HAICO_", "CLUSTER_WORK", "SLURM_", "HAICO_", "COLUMNS")


@dataclass(frozen=True)
class Command:
    """One `$ command` of a block, what it prints (masked lines) and its exit status."""

    line: str
    expected: list[str]
    status: int


def parse_block(source: str) -> list[Command]:
    """The commands of a console block, in order (a here-document's lines are its command's)."""
    commands: list[Command] = []
    line: str | None = None
    expected: list[str] = []
    lines = iter([*source.splitlines(), "$ "])
    for text in lines:
        if text.startswith("$ "):
            if line is not None:
                commands.append(_command(line, expected))
            line, expected = text[2:], []
            if (here := _HERE_DOCUMENT.search(line)) is not None:
                body = []
                for more in lines:
                    body.append(more)
                    if more == here.group(1):
                        break
                line = "\n".join([line, *body])
        elif line is not None:
            expected.append(text)
    return commands


def _command(line: str, expected: list[str]) -> Command:
    if expected and (found := _EXIT.match(expected[-1].strip())):
        return Command(line, expected[:-1], int(found.group(1)))
    return Command(line, expected, 0)


def mask(text: str) -> str:
    """`text` with what changes from run to run replaced by a name of its kind."""
    for pattern, name in _VARIABLE:
        text = pattern.sub(name, text)
    return text.rstrip()


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether the `actual` lines are the `expected` ones (both masked), a line `...` standing
    for any lines and `...` in a line for any text of that line."""
    pattern = ""
    for line in _trimmed([mask(line) for line in expected]):
        if line == ELLIPSIS:
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += r"[^\n]*?".join(map(re.escape, line.split(ELLIPSIS))) + r"\n"
    text = "".join(f"{line}\n" for line in _trimmed(actual))
    return re.fullmatch(pattern, text) is not None


def _trimmed(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def environment(home: Path) -> dict[str, str]:
    """A reader's shell: this venv's commands first on PATH, `home` as HOME, `home/tmp` as
    TMPDIR (a kept stack's state file is per user and arm there: one of its own), no colour."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    venv_bin = str(Path(sys.executable).parent)
    env.update(
        HOME=str(home),
        TMPDIR=str(home / TMPDIR),
        PATH=f"{venv_bin}:{env.get('PATH', '')}",
        NO_COLOR="1",
    )
    # A reader's git knows who they are; a new home's does not.
    for who in ("AUTHOR", "COMMITTER"):
        env.update({f"GIT_{who}_NAME": "A Reader", f"GIT_{who}_EMAIL": "reader@example.org"})
    return env


def run(command: Command, *, home: Path, cwd: Path) -> tuple[Path, str | None]:
    """Run `command` in `cwd`; the directory it ends in, and what differs (None: nothing)."""
    where = home / ".console-cwd"
    script = f"{command.line}\n__status=$?\npwd > {where}\nexit $__status\n"
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env=environment(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    after = Path(where.read_text().strip()) if where.is_file() else cwd
    output = done.stdout.replace(str(home), "~").replace(str(CLONE), SHOWN_CLONE)
    actual = [mask(line) for line in output.splitlines()]
    problems = []
    if done.returncode != command.status:
        problems.append(f"exit {done.returncode}, the page says {command.status}")
    if not matches(command.expected, actual):
        problems.append("its output differs from the page")
    if not problems:
        return after, None
    shown = "\n".join(f"    {line}" for line in output.splitlines())
    page = "\n".join(f"    {line}" for line in command.expected)
    return after, (
        f"$ {command.line}: {'; '.join(problems)}\n  the page:\n{page}\n  the run:\n{shown}"
    )


def stop_kept_stacks(home: Path) -> None:
    """Stop what a block's `haico stack up` left running in `home` (a block that failed before
    its `haico stack down`)."""
    for state in sorted((home / TMPDIR).glob("pytest-haico-*/stacks/*.json")):
        subprocess.run(
            [sys.executable, "-m", "pytest_haico", "stack", "down", state.stem],
            env=environment(home),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
