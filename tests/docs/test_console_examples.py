"""The documentation's console examples: each says how it is checked, the README's tour is
one that Sybil runs (docs/conftest.py), the ones left unchecked are the known ones, and the
comparison masks what varies and still catches a difference."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs import console

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^(?P<directive>[^\n]*)\n```console\n(?P<source>.*?)^```$", re.M | re.S)
CHECKED = re.compile(r"<!-- console: checked( in a new project)? -->")
UNCHECKED = re.compile(r"<!-- console: not checked: the output of .+ -->")
# The blocks whose output only a real Slurm, GPU, signal, full disk or a long campaign
# makes, by page and first line: what is left to check (issue 41). Checking one means
# taking it out of here.
LEFT = {
    "allocation.md": ["demo: 11 item(s) in 37.2 s", "demo: 11 item(s) in 32.4 s"],
    "cluster.md": ["$ haico env", "$ haico validate --backend-repo backend"],
    "gpus.md": [
        "$ haico gpu-check --here --device cpu --seconds 5",
        "gate failed (exit 78): arm demo: gate gpu_check failed",
        "$ haico gpu-check --here",
    ],
    "results.md": [
        "[1/6] demo q0-r0 infra_error",
        "haico: demo stack failed after 0.4 s",
        "$ pg_restore --list",
        "$ haico report results/default --html report.html",
        "$ haico compare results/paired/base results/paired/worse",
        "$ haico compare results/paired/base results/paired/slight",
    ],
    "salloc.md": ["$ salloc --time=10"],
    "serve.md": [
        "$ haico serve standin --profile local --time 30",
        "$ haico serve standin --profile local --time 3 ",
        "$ haico serve stop standin",
        "$ haico serve standin --profile local --time 30",
        "$ cat judges/arms/judge.toml",
    ],
    "submit.md": [
        "$ pytest experiments    # SIGTERM",
        "$ haico submit demo --stage smoke",
        "$ haico submit demo --stage smoke --stratum long --dry-run",
        "$ haico submit demo --stage full --stratum default",
        "$ haico submit demo --stage full --tasks 6",
        "$ haico continue demo",
        "$ haico continue demo --until-done",
        "$ .venv/bin/python benchmarks/chaos.py",
        "$ haico cost results/default",
        "arm demo, stratum chat: too few items",
    ],
    "validate.md": ["$ haico validate"],
}


def _blocks(page: Path) -> list[tuple[str, str]]:
    return [(m["directive"], m["source"]) for m in BLOCK.finditer(page.read_text("utf-8"))]


def test_every_console_block_says_how_it_is_checked() -> None:
    unsaid = [
        f"{page.relative_to(ROOT)}: {source.splitlines()[0][:60]}"
        for page in sorted((ROOT / "docs").rglob("*.md"))
        for directive, source in _blocks(page)
        if not (CHECKED.fullmatch(directive) or UNCHECKED.fullmatch(directive))
    ]
    assert not unsaid, (
        "a console block needs <!-- console: checked --> (Sybil runs it) or "
        "<!-- console: not checked: the output of ... --> before it:\n" + "\n".join(unsaid)
    )


def test_the_unchecked_blocks_are_the_ones_left() -> None:
    unchecked: dict[str, list[str]] = {}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for directive, source in _blocks(page):
            if UNCHECKED.fullmatch(directive):
                unchecked.setdefault(page.name, []).append(source.splitlines()[0])
    assert unchecked.keys() == LEFT.keys()
    for name, starts in LEFT.items():
        assert len(unchecked[name]) == len(starts), name
        assert all(
            line.startswith(start) for line, start in zip(unchecked[name], starts, strict=True)
        )


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
