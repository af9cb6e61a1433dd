"""Recording stand-ins for Slurm's client commands, on a PATH of their own."""

from __future__ import annotations

from pathlib import Path


def stand_ins(tmp_path: Path, **scripts: str) -> dict[str, str]:
    """An environment whose PATH holds only these commands (bash scripts, each writing its
    arguments to ``<tmp_path>/<name>.argv``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {tmp_path}/{name}.argv\n{body}\n')
        path.chmod(0o755)
    return {"PATH": str(bin_dir), "TZ": "America/New_York"}
