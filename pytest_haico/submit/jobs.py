"""The jobs of a submission as planned: what the user asked, their names, sbatch command
lines, pytest arguments, logs and walltimes. Shared by `haico submit` and `haico continue`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.experiment import Arm
from pytest_haico.config.frozen import INPUTS_DIGEST_ENV
from pytest_haico.config.sections import SlurmSection
from pytest_haico.config.slurm import SUPERSEDES_ENV
from pytest_haico.errors import HaicoError
from pytest_haico.report.item_costs import StratumCost, load_costs
from pytest_haico.slurm.client import SlurmError
from pytest_haico.slurm.jobs import export_option, sbatch_command
from pytest_haico.slurm.timelimits import (
    Partition,
    format_time_limit,
    gres_gpus,
    parse_time_limit,
    read_partitions,
)
from pytest_haico.submit.decisions import DEFAULT_MAX_ROUNDS
from pytest_haico.submit.inputs import Submission
from pytest_haico.submit.journal import PlannedJob

Say = Callable[[str], None]


class SubmitError(HaicoError):
    """A submission cannot go ahead as asked; the message says what to do."""


@dataclass(frozen=True)
class Request:
    """What the user asked of `haico submit` or `haico continue`."""

    arms: tuple[str, ...] = ()
    strata: tuple[str, ...] = ()
    time: str | None = None
    tasks: int | None = None
    limit: int = 2
    margin: float = 1.5
    force: tuple[str, ...] = ()
    dry_run: bool = False
    include_cancelled: bool = False
    max_rounds: int = DEFAULT_MAX_ROUNDS
    exclude_nodes: bool = True  # keep reruns off the nodes their failures cluster on


def sbatch_argv(
    submission: Submission,
    plan: PlannedJob,
    dependency: str | None,
    arm_slurm: SlurmSection | None,
) -> list[str]:
    """The exact sbatch command line of a job; the job gets the allow-listed environment
    plus what haico sets (interpreter, digest, shard count, the attempts it runs again)."""
    exports = {
        "HAICO_PYTHON": submission.python,
        INPUTS_DIGEST_ENV: submission.digest,
        "HAICO_SHARD_COUNT": str(plan.shard_count),
    }
    if plan.supersedes:
        exports[SUPERSEDES_ENV] = ":".join(plan.supersedes)
    options = [
        # Everything of a run lives on one node's loopback: whatever the batch script says.
        "--nodes=1",
        f"--job-name={plan.name}",
        f"--array={array_spec(plan.tasks)}",
        f"--time={plan.time_limit}",
        f"--chdir={submission.dir}",
        f"--output={submission.logs / _log_name(plan, '%A', '%a')}",
        export_option(exports),
    ]
    if arm_slurm is not None:
        options += arm_slurm.resource_options()
    if dependency is not None:
        options += [f"--dependency={dependency}", "--kill-on-invalid-dep=yes"]
    if plan.exclude:
        options.append(f"--exclude={','.join(plan.exclude)}")
    return sbatch_command(options, script=submission.script, args=plan.pytest_args)


def pytest_args(
    submission: Submission,
    arm: str,
    stratum: str,
    *,
    limit: int | None = None,
    items: Path | None = None,
) -> tuple[str, ...]:
    """A job's pytest arguments: the frozen copy's configuration file and rootdir explicit,
    and each option's value in the option's own word (``--haico-results=DIR``). pytest
    looks for its rootdir and configuration before plugins load, so it would take a value
    in the next word for a test path, and from there find the project's live pytest.ini."""
    ini_file = submission.dir / str(submission.manifest.get("ini_file") or "pytest.ini")
    options: dict[str, object] = {
        "--config-file": ini_file,
        "--rootdir": submission.dir,
        "--haico-profile": submission.profile,
        "--haico-results": submission.results,
        "--haico-catalogue": submission.catalogue,
        "--haico-campaign": submission.campaign,
        "--haico-experiments": submission.experiments,
        "--haico-cluster-env": submission.cluster_env,
        "--haico-arm": arm,
        "--haico-stratum": stratum,
        "--haico-limit-per-stratum": limit,
        "--haico-items": items,
    }
    words = [f"{flag}={value}" for flag, value in options.items() if value is not None]
    return (*words, str(submission.experiments))


def _option_value(plan: PlannedJob, flag: str) -> str | None:
    """The value `plan` passes `flag`, as ``--flag=value`` or (journals written before the
    jobs' arguments took that form) as ``--flag value``."""
    args = list(plan.pytest_args)
    for index, arg in enumerate(args):
        if arg.startswith(f"{flag}="):
            return arg.removeprefix(f"{flag}=")
        if arg == flag and index + 1 < len(args):
            return args[index + 1]
    return None


def log_of(submission: Submission, plan: PlannedJob, job_id: str, task: int) -> Path:
    """The log Slurm writes for task `task` of the job (it exists once the task started)."""
    return submission.logs / _log_name(plan, job_id, str(task))


def _log_name(plan: PlannedJob, job_id: str, task: str) -> str:
    return f"{plan.stage}.{plan.arm}.{plan.stratum}-{job_id}_{task}.out"


def plan_items_file(plan: PlannedJob) -> Path | None:
    value = _option_value(plan, "--haico-items")
    return Path(value) if value is not None else None


def limit_of(plan: PlannedJob) -> int | None:
    value = _option_value(plan, "--haico-limit-per-stratum")
    return int(value) if value is not None else None


def job_name(submission: Submission, stage: str, arm: str, stratum: str) -> str:
    """Deterministic: the same stage of the same inputs always has the same name."""
    return f"haico.{submission.campaign}.{submission.name}.{stage}.{arm}.{stratum}"


def measured_costs(
    campaign_dir: Path, say: Say, *, current: Mapping[str, Mapping[str, str]]
) -> dict[tuple[str, str], StratumCost]:
    """The costs measured of the `current` items (`item_costs.current_items`)."""
    if not any(campaign_dir.glob("*/ledger/*.jsonl")):
        return {}  # nothing measured yet
    return load_costs(
        campaign_dir, warn=lambda m: say(f"haico: ledger warning: {m}"), current=current
    )


def partition_caps(say: Say) -> list[Partition] | None:
    try:
        return read_partitions()
    except SlurmError as exc:
        say(f"haico: no partition limits ({exc}); walltimes are not capped")
        return None


def check_gpus_on_one_node(arm: Arm, partition: Partition | None) -> None:
    """Refuse, before anything is queued, an arm whose vLLM cannot get its GPUs: tensor
    parallel x data parallel GPUs, all on the job's one node (gate parallel_width would stop
    every task at its start), from its `[slurm] gres` and its partition's largest node."""
    tp, dp = arm.vllm.tensor_parallel_size, arm.vllm.data_parallel_size
    wanted = tp * dp
    needs = f"arm {arm.name} needs tensor_parallel_size {tp} x data_parallel_size {dp} = {wanted}"
    gres = arm.slurm.gres if arm.slurm is not None else None
    if gres is not None and gres_gpus(gres) not in (0, wanted):  # none: the script may ask
        raise SubmitError(
            f"{needs} GPUs, but its [slurm] gres = {gres!r} asks for {gres_gpus(gres)}: set "
            f'gres = "gpu:{wanted}" in arms/{arm.name}.toml, or change the parallel sizes'
        )
    most = partition.gpus_per_node if partition is not None else None
    if partition is not None and most is not None and most < wanted:
        has = f"has more than {most}" if most else "has a GPU"
        raise SubmitError(
            f"{needs} GPUs on one node (a model copy cannot span nodes), but no node of "
            f"partition {partition.name} {has} (sinfo's GRES): lower the "
            f"parallel sizes in arms/{arm.name}.toml, or choose a partition with {wanted}-GPU "
            "nodes ([slurm] partition)"
        )


def checked_time(text: str, where: str) -> str:
    try:
        seconds = parse_time_limit(text)
    except HaicoError as exc:
        raise SubmitError(f"{where}: {exc}") from None
    return text if seconds is None else format_time_limit(seconds)


def array_spec(tasks: Iterable[int]) -> str:
    """0,1,2,5 -> "0-2,5"."""
    ordered = sorted(set(tasks))
    parts: list[str] = []
    start = prev = ordered[0]
    for task in [*ordered[1:], None]:
        if task is not None and task == prev + 1:
            prev = task
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if task is not None:
            start = prev = task
    return ",".join(parts)
