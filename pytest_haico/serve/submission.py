"""`haico serve <arm>`: submit the model job that serves an arm under a catalogue name."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.bounds import ARM_NAME
from pytest_haico.config.cluster_env import ClusterEnv
from pytest_haico.config.experiment import load_arm
from pytest_haico.config.settings import Profile
from pytest_haico.errors import CatalogueError, ConfigError
from pytest_haico.serve.catalogue import entry_path, make_catalogue_dir
from pytest_haico.serve.resolver import resolve_served
from pytest_haico.slurm.jobs import sbatch
from pytest_haico.slurm.timelimits import parse_time_limit

SCRIPT = Path(__file__).parents[1] / "templates" / "serve.sbatch"
# Slurm's warning before the time limit (USR1 to the batch shell): time to deregister and
# stop the server before TERM.
SIGNAL_LEAD_S = 60
Say = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class ServeRequest:
    """What `haico serve` was asked: which arm, under which name, for how long, where."""

    arm: str
    experiments: Path
    catalogue: Path
    profile: Profile
    name: str | None = None  # default: the arm's name
    time: str | None = None  # default: the arm's [slurm] time, else the partition's
    cluster_env: Path | None = None
    site: ClusterEnv | None = None
    file_mode: int = 0o640
    python: str = sys.executable


def logs_dir(catalogue: Path) -> Path:
    """Where the model jobs' batch logs and their servers' logs go."""
    return catalogue / "logs"


def job_name(name: str) -> str:
    return f"haico.serve.{name}"


def serve(request: ServeRequest, *, say: Say) -> int:
    """Submit the model job; 0 once Slurm took it. Refuses a name that is served already."""
    arm_file = request.experiments / "arms" / f"{request.arm}.toml"
    if not arm_file.is_file():
        raise ConfigError(str(arm_file), "", f"no arm {request.arm!r}: no such arm file")
    arm = load_arm(arm_file)
    name = request.name or arm.name
    if not ARM_NAME.match(name) or name in ("status", "stop"):
        raise ConfigError(
            "--name", "", f"{name!r} is not a served model's name: use [a-z0-9_.] with inner '-'"
        )
    time = request.time or (arm.slurm.time if arm.slurm is not None else None)
    if time is not None:
        parse_time_limit(time, where="--time")
    make_catalogue_dir(request.catalogue, file_mode=request.file_mode)
    _refuse_if_served(request.catalogue, name)
    argv = sbatch_argv(request, arm_file=arm_file, name=name, time=time)
    if arm.slurm is not None:
        argv[2:2] = arm.slurm.resource_options()
    logs = logs_dir(request.catalogue)
    make_catalogue_dir(logs, file_mode=request.file_mode)
    job_id = sbatch(argv)
    say(
        f"haico: submitted job {job_id} to serve arm {arm.name} as {name!r} "
        f"({request.profile.value} profile, time limit {time or 'the partition default'})"
    )
    say(f"haico: it registers {entry_path(request.catalogue, name)} once its model is healthy")
    say(f"haico: log: {logs / f'{name}.{job_id}.out'}")
    say(f"haico: next: haico serve status {name}")
    return 0


def sbatch_argv(request: ServeRequest, *, arm_file: Path, name: str, time: str | None) -> list[str]:
    """The exact sbatch command line (the job gets the allow-listed environment and the
    interpreter; no secret: the job makes its own key)."""
    logs = logs_dir(request.catalogue)
    if "," in request.python:
        raise ConfigError(
            "HAICO_PYTHON", "", f"{request.python} has a comma, which sbatch cannot pass"
        )
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name(name)}",
        f"--output={logs}/{name}.%j.out",
        f"--chdir={logs}",
        f"--signal=B:USR1@{SIGNAL_LEAD_S}",
        "--requeue",
        f"--export=ALL,HAICO_PYTHON={request.python}",
    ]
    if time is not None:
        argv.append(f"--time={time}")
    argv += [str(SCRIPT), "--arm-file", str(arm_file), "--name", name]
    argv += ["--profile", request.profile.value, "--catalogue", str(request.catalogue)]
    argv += ["--log-dir", str(logs), "--file-mode", f"{request.file_mode:o}"]
    if request.cluster_env is not None:
        argv += ["--cluster-env", str(request.cluster_env)]
    key_group = request.site.get("SERVE_KEY_GROUP") if request.site is not None else None
    if key_group:
        argv += ["--key-group", key_group]
    return argv


def _refuse_if_served(catalogue: Path, name: str) -> None:
    """A live entry of `name` belongs to a running job: a second would take its name."""
    try:
        served = resolve_served(name, catalogue=catalogue)
    except CatalogueError:
        return  # none, or stale: this job registers in its place
    raise CatalogueError(
        f"{name!r} is served already, by job {served.entry.job.id} at {served.endpoint}: "
        f"`haico serve stop {name}` first, or serve this arm under another --name"
    )
