"""`haico env` on the login node: what is missing (a venv not built from the current lock,
SIFs not pulled), checked here so that bad input is one line now, not a failed job later;
then one job on the CPU partition that builds and pulls it. Nothing missing: no job."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.cluster_site import ClusterSite
from pytest_haico.config.experiment import Arm, load_arm
from pytest_haico.errors import HaicoError
from pytest_haico.files import DEFAULT_FILE_MODE, make_dirs, ownership_problem
from pytest_haico.locks import holding
from pytest_haico.site.images import images_to_pull, is_pulled, read_token
from pytest_haico.site.plan import EnvPlan, VenvBuild, write_plan
from pytest_haico.site.venv import check_replaceable, is_built, lock_digest
from pytest_haico.slurm.jobs import export_option, live_jobs_named, sbatch, sbatch_command
from pytest_haico.stamps import utc_name

JOB_NAME = "haico-env"
# In the job's log directory; held across the queue check and the sbatch.
LOCK_NAME = ".haico-env.lock"
SCRIPT = Path(__file__).parents[1] / "templates" / "env.sbatch"
DEFAULT_TIME = "1:00:00"

Say = Callable[[str], None]


class EnvError(HaicoError):
    """`haico env` cannot go ahead as asked; the message says what to do."""


@dataclass(frozen=True)
class EnvRequest:
    """What the user asked of `haico env`."""

    venv: bool = True
    images: bool = True
    arms: tuple[str, ...] = ()
    time: str = DEFAULT_TIME
    dry_run: bool = False


def run_env(
    site: ClusterSite,
    experiments: Path,
    request: EnvRequest,
    *,
    environ: Mapping[str, str],
    say: Say,
) -> int:
    """Plan, then submit the job (or print its sbatch line); 0 also when nothing is missing.

    Under a lock in the log directory, and only while none of the user's `haico-env` jobs
    is queued or running (a second would delete the venv the first installs into), it plans
    again and submits: two `haico env` at once submit one job, what it did is not redone.
    """
    plan = plan_env(site, experiments, request, say=say)
    if _nothing_to_do(plan, request, say):
        return 0
    logs = _logs_dir(site)
    plan_file = logs / f"plan-{utc_name()}-{time.time_ns() % 10**9:09d}.json"
    argv = env_sbatch_argv(site, plan_file=plan_file, logs=logs, time_limit=request.time)
    if request.dry_run:
        say(f"haico env: would submit (it {plan.describe()}): {shlex.join(argv)}")
        return 0
    make_dirs(logs, DEFAULT_FILE_MODE)
    problem = ownership_problem(logs.lstat())
    if problem is not None:
        raise EnvError(f"{logs} {problem}: the job's plan and log cannot go there")
    with holding(logs / LOCK_NAME, what="haico env's job", command="env", say=say):
        queued = live_jobs_named(JOB_NAME, environ=environ)
        if queued:
            jobs = ", ".join(f"{job} ({state})" for job, state in sorted(queued.items()))
            say(
                f"haico env: your job {jobs} named {JOB_NAME} is in the queue; nothing "
                "submitted: run haico env again once it has ended, for what it left missing"
            )
            return 0
        plan = plan_env(site, experiments, request, say=lambda _: None)  # a job since did it?
        if _nothing_to_do(plan, request, say):
            return 0
        write_plan(plan_file, plan)
        job_id = sbatch(argv, environ=environ)
    say(f"haico env: job {job_id} {plan.describe()}; log {logs / f'env-{job_id}.out'}")
    return 0


def _nothing_to_do(plan: EnvPlan, request: EnvRequest, say: Say) -> bool:
    if plan.venv is not None or plan.pulls:
        return False
    what = "the venv and the images are" if request.venv else "the images are"
    say(f"haico env: nothing to do: {what if request.images else 'the venv is'} in place")
    return True


def plan_env(site: ClusterSite, experiments: Path, request: EnvRequest, *, say: Say) -> EnvPlan:
    """What the job must do; what is in place already is said, not planned."""
    build = _plan_venv(site, say=say) if request.venv else None
    pulls = []
    if request.images:
        named = images_to_pull(site, _arms(experiments, request.arms))
        if not named:
            say("haico env: no image to pull: cluster.env and the arms name none by digest")
        for pull in named:
            if is_pulled(pull):
                say(f"haico env: {pull.sif} is already pulled")
            else:
                pulls.append(pull)
    if pulls and site.registry_token_file is not None:
        read_token(site.registry_token_file)  # refused here, before a job would refuse it
    return EnvPlan(
        venv=build,
        pulls=tuple(pulls),
        token_file=site.registry_token_file if pulls else None,
        registry_user=site.registry_user,
    )


def _plan_venv(site: ClusterSite, *, say: Say) -> VenvBuild | None:
    if site.vllm_venv is None:
        raise EnvError(f"{site.source}: VLLM_VENV is not set: name the directory of the vLLM venv")
    if site.vllm_requirements is None:
        raise EnvError(
            f"{site.source}: VLLM_REQUIREMENTS is not set: name the pinned requirements file "
            "to build VLLM_VENV from"
        )
    digest = lock_digest(site.vllm_requirements)
    marker = is_built(site.vllm_venv, digest)
    if marker is not None:
        say(f"haico env: {site.vllm_venv} is up to date: {marker.describe()}")
        return None
    check_replaceable(site.vllm_venv)
    return VenvBuild(venv=site.vllm_venv, requirements=site.vllm_requirements, sha256=digest)


def _arms(experiments: Path, names: Sequence[str]) -> list[Arm]:
    files = {path.stem: path for path in sorted((experiments / "arms").glob("*.toml"))}
    unknown = [name for name in names if name not in files]
    if unknown:
        known = ", ".join(files) or "none"
        raise EnvError(f"no arm {unknown[0]!r} in {experiments / 'arms'} (arms: {known})")
    return [load_arm(files[name]) for name in names or files]


def _logs_dir(site: ClusterSite) -> Path:
    """`$CLUSTER_WORK/haico-env`, else beside the venv, else beside SIF_DIR."""
    if site.work is not None:
        return site.work / "haico-env"
    for place in (site.vllm_venv, site.sif_dir):
        if place is not None:
            return place.parent / "haico-env"
    raise EnvError(f"{site.source}: set CLUSTER_WORK: no place for the job's log")


def env_sbatch_argv(
    site: ClusterSite, *, plan_file: Path, logs: Path, time_limit: str
) -> list[str]:
    """The job's sbatch line: the CPU partition, the account and QOS of cluster.env, the
    allow-listed environment plus the interpreter (never a credential), the plan's path."""
    options = [
        f"--job-name={JOB_NAME}",
        "--nodes=1",
        f"--time={time_limit}",
        f"--chdir={logs}",
        f"--output={logs}/env-%j.out",
        export_option({"HAICO_PYTHON": sys.executable}),
    ]
    for flag, value in (
        ("--partition", site.cpu_partition),
        ("--account", site.account),
        ("--qos", site.qos),
    ):
        if value:
            options.append(f"{flag}={value}")
    return sbatch_command(options, script=SCRIPT, args=[str(plan_file)])
