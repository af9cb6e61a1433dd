"""The documentation's console examples: every one is checked (Sybil runs it:
docs/conftest.py), no other block is a transcript in disguise, the README's tour is one of
them, and the comparison masks what varies and still catches a difference."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs import console

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^(?P<directive>[^\n]*)\n```console\n(?P<source>.*?)^```$", re.M | re.S)
CHECKED = re.compile(r"<!-- console: checked( in a new project)? -->")
# Any fenced block, by its language, and a prompt line in it: a shell session's transcript.
FENCE = re.compile(r"^```(?P<language>\S*)\n(?P<source>.*?)^```$", re.M | re.S)
PROMPT = re.compile(r"^\$ ", re.M)


def _blocks(page: Path) -> list[tuple[str, str]]:
    return [(m["directive"], m["source"]) for m in BLOCK.finditer(page.read_text("utf-8"))]


def _pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def unchecked_blocks(pages: list[Path]) -> list[str]:
    """The ```console blocks of `pages` that no checked directive precedes, and the other
    fenced blocks that show a `$ ` prompt (a transcript no test would run)."""
    found = []
    for page in pages:
        text = page.read_text("utf-8")
        for directive, source in _blocks(page):
            if not CHECKED.fullmatch(directive):
                found.append(f"{page.name}: {source.splitlines()[0][:60]}")
        for fence in FENCE.finditer(text):
            if fence["language"] != "console" and PROMPT.search(fence["source"]):
                found.append(f"{page.name}: a ```{fence['language']} block with a $ prompt")
    return found


def test_every_console_block_is_checked() -> None:
    unchecked = unchecked_blocks(_pages())
    assert not unchecked, (
        "a console block needs <!-- console: checked --> (or <!-- console: checked in a new "
        "project -->) before it, so that Sybil runs it; what cannot run here is prose or a "
        "quoted line, not a transcript:\n" + "\n".join(unchecked)
    )


def test_an_unchecked_block_and_a_transcript_in_disguise_are_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- console: checked -->\n```console\n$ true\n```\n\n"
        "```console\n$ haico env\nhaico env: job 1\n```\n\n"
        "```text\n$ sbatch x\nSubmitted batch job 2\n```\n\n"
        "```sh\nsbatch x    # no prompt: commands to run, not a transcript\n```\n"
    )
    assert unchecked_blocks([page]) == [
        "page.md: $ haico env",
        "page.md: a ```text block with a $ prompt",
    ]


def test_the_readme_tour_is_a_checked_block_of_get_started() -> None:
    ((_, tour),) = _blocks(ROOT / "README.md")
    checked = [s for d, s in _blocks(ROOT / "docs" / "get-started.md") if CHECKED.fullmatch(d)]
    assert tour in checked


def test_a_block_is_commands_with_their_output_and_exit_status() -> None:
    block = "$ cat > f <<'EOF'\na\nEOF\n$ cat f\na\n$ false\n(exit 1)\n"
    assert console.parse_block(block) == [
        console.Command("cat > f <<'EOF'\na\nEOF", [], 0),
        console.Command("cat f", ["a"], 0),
        console.Command("false", [], 1),
    ]


def test_the_comparison_masks_what_varies_and_catches_a_difference() -> None:
    page = [
        "...",
        "haico: standin stack healthy in 1.9 s (ready: ...)",
        "[1/2] standin greet-r0 completed 0.0 s · 1 in flight · ETA 0.2 s",
        "  ledger: ~/p/results/default/standin/ledger/local-20261207T053451Z-10118.1.jsonl",
    ]
    run = [
        "============================= test session starts ==============================",
        "collected 2 items",
        "haico: standin stack healthy in 12.25 s (ready: llm 0.4 s, postgres 0.5 s)",
        "[1/2] standin greet-r0 completed 1.5 s · 1 in flight · ETA 3 m 2 s",
        "  ledger: ~/p/results/default/standin/ledger/local-20261208T000000Z-7.1.jsonl",
    ]
    assert console.matches(page, [console.mask(line) for line in run])
    run[3] = run[3].replace("completed", "blank_turn")
    assert not console.matches(page, [console.mask(line) for line in run])
