"""`haico serve <arm>`: submit the model job that serves an arm under a catalogue name."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from pytest_haico.config.bounds import ARM_NAME
from pytest_haico.config.cluster_env import ClusterEnv
from pytest_haico.config.experiment import load_arm
from pytest_haico.config.settings import Profile
from pytest_haico.errors import CatalogueError, ConfigError
from pytest_haico.files import shown_path
from pytest_haico.locks import holding
from pytest_haico.serve.catalogue import entry_path, make_catalogue_dir
from pytest_haico.serve.renewal import Renewal, minutes, plan_successor, resolve_renewal
from pytest_haico.serve.resolver import resolve_served
from pytest_haico.slurm.jobs import (
    export_option,
    jobs_named,
    live_jobs_named,
    sbatch,
    sbatch_command,
)
from pytest_haico.slurm.timelimits import parse_time_limit
from pytest_haico.stamps import utc_iso

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
    until: str | None = None  # the whole service's time: renewal (`serve.renewal`)
    renew_lead: str | None = None
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
    renewal = resolve_renewal(
        time=time, until=request.until, lead=request.renew_lead, now=datetime.now(UTC)
    )
    make_catalogue_dir(request.catalogue, file_mode=request.file_mode)
    _refuse_if_served(request.catalogue, name)
    key_group = request.site.get("SERVE_KEY_GROUP") if request.site is not None else None
    job = ModelJob(
        arm_file=arm_file,
        name=name,
        profile=request.profile,
        catalogue=request.catalogue,
        file_mode=request.file_mode,
        python=request.python,
        time=time,
        resources=tuple(arm.slurm.resource_options()) if arm.slurm is not None else (),
        cluster_env=request.cluster_env,
        key_group=key_group or None,
        renewal=renewal,
    )
    argv = sbatch_argv(job)
    logs = logs_dir(request.catalogue)
    make_catalogue_dir(logs, file_mode=request.file_mode)
    # Registered only once healthy: a job of the name that is queued or starting is seen
    # in the queue.
    with holding(
        logs / f".{name}.lock", what=f"the served name {name!r}", command="serve", say=say
    ):
        _refuse_if_queued(name)
        job_id = sbatch(argv)
    say(
        f"haico: submitted job {job_id} to serve arm {arm.name} as {name!r} "
        f"({request.profile.value} profile, time limit {time or 'the partition default'})"
    )
    if renewal is not None:
        say(
            f"haico: it renews itself until {utc_iso(renewal.until)}: "
            f"its successor is queued to start {renewal.lead_min} min before its end"
        )
    entry = shown_path(entry_path(request.catalogue, name))
    say(f"haico: it registers {entry} once its model is healthy")
    say(f"haico: log: {shown_path(logs / f'{name}.{job_id}.out')}")
    say(f"haico: next: haico serve status {name}")
    return 0


@dataclass(frozen=True, kw_only=True)
class ModelJob:
    """One model job's submission, all its sbatch command line says: the job reads it back
    from its arguments (`job_arguments`) to submit its successor alike."""

    arm_file: Path
    name: str
    profile: Profile
    catalogue: Path
    file_mode: int
    python: str
    time: str | None
    resources: tuple[str, ...] = ()
    cluster_env: Path | None = None
    key_group: str | None = None
    renewal: Renewal | None = None

    def job_arguments(self) -> list[str]:
        """The arguments of `python -m pytest_haico.serve.job` (`serve.job`'s parser)."""
        args = ["--arm-file", str(self.arm_file), "--name", self.name]
        args += ["--profile", self.profile.value, "--catalogue", str(self.catalogue)]
        args += ["--log-dir", str(logs_dir(self.catalogue)), "--file-mode", f"{self.file_mode:o}"]
        if self.cluster_env is not None:
            args += ["--cluster-env", str(self.cluster_env)]
        if self.key_group:
            args += ["--key-group", self.key_group]
        if self.time is not None:
            args += ["--time", self.time]
        if self.renewal is not None:
            args += ["--until", utc_iso(self.renewal.until)]
            args += ["--renew-lead", str(self.renewal.lead_min)]
        return args


def sbatch_argv(job: ModelJob, *, after: str | None = None) -> list[str]:
    """The exact sbatch command line (the job gets the allow-listed environment and the
    interpreter; no secret: the job makes its own key); `after` (a `--dependency=...`) for a
    successor."""
    logs = logs_dir(job.catalogue)
    options = [
        "--nodes=1",  # a model's GPUs on one node: whatever the batch script says
        *job.resources,
        f"--job-name={job_name(job.name)}",
        f"--output={logs}/{job.name}.%j.out",
        f"--chdir={logs}",
        f"--signal=B:USR1@{SIGNAL_LEAD_S}",
        "--requeue",
        export_option({"HAICO_PYTHON": job.python}),
    ]
    if job.time is not None:
        options.append(f"--time={job.time}")
    if after is not None:
        options.append(after)
    return sbatch_command(options, script=SCRIPT, args=job.job_arguments())


def _refuse_if_queued(name: str) -> None:
    """A job of `name` in the queue (pending, or starting its model): a second would hold
    GPUs for a model that is served already."""
    queued = live_jobs_named(job_name(name))
    if queued:
        jobs = ", ".join(f"{job} ({state})" for job, state in sorted(queued.items()))
        raise CatalogueError(
            f"{name!r} has your job {jobs} in the queue already; it registers once its model "
            f"is healthy (`haico serve status {name}`): wait for it, or `haico serve stop "
            f"{name}` first"
        )


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


def queue_successor(job: ModelJob, job_id: str, *, started: datetime) -> str:
    """Submit the successor of model job `job_id` (which `started` then) unless one is queued
    already (a requeued job registers again) or the deadline has come: what was done."""
    assert job.renewal is not None and job.time is not None
    time_s = parse_time_limit(job.time, where="--time") or 0.0
    successor = plan_successor(started=started, time_min=minutes(time_s), renewal=job.renewal)
    until = utc_iso(job.renewal.until)
    if successor is None:
        return f"no successor: the service ends with this job (until {until})"
    pending = [i for i, state in jobs_named(job_name(job.name)).items() if state == "PENDING"]
    if pending:
        return f"no successor: job {', '.join(pending)} is queued already"
    following = replace(job, time=str(successor.time_min))
    new_id = sbatch(sbatch_argv(following, after=successor.dependency(job_id)))
    return (
        f"queued job {new_id} to start {successor.delay_min} min after this job started, "
        f"for {successor.time_min} min (until {until})"
    )
