"""`runs/<run_id>/run-config.env` and `run-config.json`: what ran, every knob, no secret.

The .env file is KEY=VALUE, sorted, each value quoted for bash (`source` it); the .json
file holds the same values plus what does not fit a line (the model server's models and
its metrics at the arm's start and end, from `model_server`). Both are rewritten whole or not
at all whenever something is added, and pass the run's redaction filter first.
"""

from __future__ import annotations

import json
import platform
import shlex
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_haico import __version__
from pytest_haico.config.experiment import Arm
from pytest_haico.config.identity import source_tree
from pytest_haico.config.settings import Settings
from pytest_haico.config.slurm import SlurmJob
from pytest_haico.files import read_results_file, write_atomic
from pytest_haico.ledger.layout import RUN_CONFIG_ENV, RUN_CONFIG_JSON
from pytest_haico.redact import Redactor
from pytest_haico.slurm import client as slurm

if TYPE_CHECKING:
    from pytest_haico.config.items import ItemSpec

ENV_NAME = RUN_CONFIG_ENV
JSON_NAME = RUN_CONFIG_JSON
# What a later run of the arm is compared on: a change means results that mix the runs
# were measured on different software or hardware.
COMPARED = (
    "HARNESS_VERSION",
    "PYTHON_VERSION",
    "POSTGRES_VERSION",
    "SLURM_VERSION",
    "MODEL_SERVER",
    "MODEL_SERVER_VERSION",
    "VLLM_VERSION",
    "GPUS",
    "MODEL_IDENTITY",
    "BACKEND_IDENTITY",
)
_SECRET_VARIABLES = frozenset({"VLLM_API_KEY"})


class RunConfig:
    """The provenance files of one run directory."""

    def __init__(self, run_dir: Path, *, redactor: Redactor, file_mode: int = 0o640) -> None:
        self.run_dir = run_dir
        self.redactor = redactor
        self.file_mode = file_mode
        self.values: dict[str, str] = {}
        self.details: dict[str, Any] = {}

    def update(self, values: Mapping[str, str]) -> None:
        self.values.update(values)

    def detail(self, key: str, value: Any) -> None:
        """A structured value for the .json file only."""
        self.details[key] = value

    def write(self) -> None:
        values = {key: self.redactor.redact(str(v)) for key, v in sorted(self.values.items())}
        env_text = "".join(f"{key}={shlex.quote(value)}\n" for key, value in values.items())
        details = json.loads(self.redactor.redact(json.dumps(self.details, sort_keys=True)))
        json_text = json.dumps({"values": values, **details}, indent=1, sort_keys=True) + "\n"
        write_atomic(self.run_dir / ENV_NAME, env_text.encode(), mode=self.file_mode)
        write_atomic(self.run_dir / JSON_NAME, json_text.encode(), mode=self.file_mode)

    def changed_since(self, previous_run: Path) -> list[str]:
        """`KEY old → new` for each compared key that differs from an earlier run's."""
        try:
            earlier = json.loads(read_results_file(previous_run / JSON_NAME))["values"]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        changes = []
        for key in COMPARED:
            old, new = earlier.get(key), self.values.get(key)
            if old is not None and new is not None and old != new:
                changes.append(f"{key} {old} → {new}")
        return changes


def previous_run(runs_dir: Path, this_run: Path) -> Path | None:
    """The newest other run directory of the arm that has a run-config."""
    try:
        candidates = [p for p in runs_dir.iterdir() if p != this_run and (p / JSON_NAME).is_file()]
    except OSError:
        return None
    return max(candidates, key=lambda p: (p / JSON_NAME).stat().st_mtime, default=None)


def knob_values(settings: Settings, arm: Arm) -> dict[str, str]:
    """Every resolved option (and where it came from), the arm's fields and the site's."""
    values: dict[str, str] = {}
    for name, value in vars(settings).items():
        if name in ("model_api_key", "sources", "site"):
            continue
        values[f"OPTION_{name.upper()}"] = _text(value)
    for name, source in settings.sources.items():
        values[f"OPTION_{name.upper()}_SOURCE"] = source
    if settings.site is not None:
        values.update({f"SITE_{k}": v for k, v in settings.site.values.items()})
    values.update(_flatten("ARM", arm.model_dump(mode="json")))
    # Left out of model_dump (and so of the item_id): not result-relevant, but what ran.
    values["ARM_VLLM_START_TIMEOUT_S"] = _text(arm.vllm.start_timeout_s)
    values["ARM_VLLM_START_STALL_TIMEOUT_S"] = _text(arm.vllm.start_stall_timeout_s)
    if arm.model.hf_id:
        values["MODEL_PINNED"] = "1" if arm.model.revision else "0"
    return values


def arm_values(
    settings: Settings,
    arm: Arm,
    job: SlurmJob,
    spec: ItemSpec | None,
    environ: Mapping[str, str],
) -> dict[str, str]:
    """What run-config records of an arm before its stack starts: its knobs, the host and
    the identities its items (`spec`, one of them, if any are planned) get."""
    values = knob_values(settings, arm)
    values.update(host_values(job, settings.experiments, environ))
    if spec is not None:
        values["MODEL_IDENTITY"] = spec.model_identity
        values["BACKEND_IDENTITY"] = spec.backend_identity
    return values


def host_values(job: SlurmJob, experiments: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The harness, the interpreter, the node, its GPUs, the Slurm job, the experiments'
    git state, and the VLLM_* variables (the key excepted)."""
    tree = source_tree(experiments)
    values = {
        "HARNESS_VERSION": __version__,
        "PYTHON_VERSION": platform.python_version(),
        "NODE": job.node or socket.gethostname(),
        "EXPERIMENTS_GIT_COMMIT": tree.commit or "none",
        "EXPERIMENTS_GIT_DIRTY": "1" if tree.dirty else "0",
        "GPUS": _gpus(environ),
        "SLURM_VERSION": slurm.version(environ) or "none",
    }
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
                 "SLURM_RESTART_COUNT", "SLURM_JOB_PARTITION", "SLURM_JOB_NODELIST",
                 "CUDA_VISIBLE_DEVICES"):  # fmt: skip
        if environ.get(name):
            values[name] = environ[name]
    for name, value in environ.items():
        if name.startswith("VLLM_") and name not in _SECRET_VARIABLES:
            values[f"ENV_{name}"] = value
    return values


def _gpus(environ: Mapping[str, str]) -> str:
    """`name uuid driver` of each GPU this job may use, `;`-separated; "none" without any."""
    lines = _run(
        ["nvidia-smi", "--query-gpu=name,uuid,driver_version", "--format=csv,noheader"],
        environ,
    )
    gpus = [", ".join(part.strip() for part in line.split(",")) for line in lines]
    return "; ".join(gpus) if gpus else "none"


def _run(argv: list[str], environ: Mapping[str, str]) -> list[str]:
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=10, check=False, env=dict(environ)
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if result.returncode != 0:
        return []
    return [line for line in result.stdout.splitlines() if line.strip()]


def _flatten(prefix: str, value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        flat: dict[str, str] = {}
        for key, item in value.items():
            flat.update(_flatten(f"{prefix}_{str(key).upper()}", item))
        return flat
    return {prefix: _text(value)}


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list | tuple):
        return json.dumps([_text(v) if isinstance(v, Path) else v for v in value])
    if isinstance(value, Mapping):
        return json.dumps(dict(value), sort_keys=True, default=str)
    return str(value)
