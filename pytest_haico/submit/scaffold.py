"""A new experiments repository that runs at once on the local profile (`haico init`).

It holds one arm (the stand-in model), two scripts (one branches and expects a document),
the test module, a cluster.env template, the batch script submissions run, and a
pytest.ini with what a campaign wants: pytest-asyncio's loop scope set, start-up-only
plugins off, the haico settings batch jobs rely on.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from pytest_haico.errors import HaicoError
from pytest_haico.files import ownership_problem

TEMPLATE = Path(__file__).parents[1] / "templates" / "project"


class InitError(HaicoError):
    """The new repository cannot be written where asked."""


def init(target: Path) -> list[Path]:
    """Write the repository into `target` (new, or an empty directory); the files written."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise InitError(
            f"{target} exists and is not an empty directory: give a new directory, or move "
            "what is there"
        )
    problem = ownership_problem(target.stat()) if target.exists() else None
    if problem is not None:
        raise InitError(
            f"{target} {problem}: another user could swap what your campaigns run (the test "
            "module is Python that pytest imports): give a directory of your own"
        )
    # Imported here: `haico` loads every command's module, and these load the experiment
    # models (pydantic), which no other command's start-up should pay for.
    from pytest_haico.config.items import ITEM_MODULE
    from pytest_haico.submit.inputs import PACKAGED_SCRIPT, SCRIPT_FILE

    written: list[Path] = []
    try:
        for source in sorted(TEMPLATE.rglob("*")):
            if source.is_file():
                destination = target / source.relative_to(TEMPLATE)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, destination)
                written.append(destination)
        test_module = target / "experiments" / "test_conversations.py"
        test_module.write_text(_test_module(ITEM_MODULE))
        script = target / "sbatch" / SCRIPT_FILE
        script.parent.mkdir(exist_ok=True)
        shutil.copyfile(PACKAGED_SCRIPT, script)
        script.chmod(0o755)
    except OSError as exc:
        raise InitError(f"cannot write {target}: {exc.strerror or exc}") from exc
    return sorted([*written, test_module, script])


def _test_module(item_module: str) -> str:
    return (
        '"""The campaign\'s one test: each item is a scripted conversation (arm x script x '
        'repeat)."""\n\nfrom __future__ import annotations\n\n'
        + textwrap.dedent(item_module)
        + "\n"
    )
