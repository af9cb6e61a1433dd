"""No example in the documentation carries a path of the machine it ran on: paths are shown
relative to the campaign, under `~/`, or under `$TMPDIR`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# An absolute path into a machine's own places: a work folder, root's or a user's home, a
# temporary directory (pytest's included), /opt, a Mac's home. Not `~/work/` or `$TMPDIR/`.
MACHINE_PATH = re.compile(
    r"(?<![\w.~$}/…-])/(?:work|root|home/[a-z_][\w.-]*|tmp|opt|Users)(?=/|\b)"
)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def machine_paths(text: str) -> list[tuple[int, str]]:
    """Each line of `text` (from 1) that holds a machine path, and the path's start."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        match = MACHINE_PATH.search(line)
        if match is not None:
            found.append((number, line[match.start() : match.start() + 40]))
    return found


def test_no_page_holds_a_machine_path() -> None:
    found = [
        f"{page.relative_to(ROOT)}:{number}: {path}"
        for page in _pages()
        for number, path in machine_paths(page.read_text(encoding="utf-8"))
    ]
    assert not found, "machine paths in the docs (show them under ~/ or relative):\n" + "\n".join(
        found
    )


def test_the_check_finds_the_paths_it_names_and_spares_neutral_ones() -> None:
    text = "\n".join(
        [
            "log /tmp/walk/results/default/x.log",
            "--export=HAICO_PYTHON=/work/wt-env/.venv/bin/python3",
            "in /tmp/pytest-of-root/pytest-200/test_x0",
            "cd /root/project",
            "cat /home/alice/x",
            "venv /opt/venvs/haico/bin/python",
            "neutral: ~/work/gpu-check, $TMPDIR/pytest-haico-1000, results/default",
            "also neutral: ~/site/work/sif, /models/Qwen2.5-32B, /usr/lib/postgresql",
        ]
    )
    assert [number for number, _ in machine_paths(text)] == [1, 2, 3, 4, 5, 6]
