"""What Slurm's commands print, read into typed records: one parser per command output.

Job states stay Slurm's words (an open set: each Slurm version adds some); `FINAL_STATES`
and `HOLDING_STATES` name the two questions callers ask of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# States a job never leaves: it has ended.
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "TIMEOUT",
        "PREEMPTED",
        "NODE_FAIL",
        "CANCELLED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)
# States of a job that still holds its nodes.
HOLDING_STATES = frozenset(
    {"RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING", "STOPPED", "RESIZING"}
)
# Why a pending job will not start by itself, as `scontrol show job` says (Reason=): its
# launch failed (a node that lost its network, a "Duplicate jobid" of the run left there) and
# Slurm requeued it held, for a person to `scontrol release`.
LAUNCH_HELD = "launch_failed_requeued_held"
# What Slurm prints for a time it does not have: a pending job's end, an UNLIMITED one's.
_NO_TIME = frozenset({"", "unknown", "n/a", "none"})


def parse_slurm_time(text: str) -> float | None:
    """Epoch seconds of a timestamp as Slurm prints it (local time, no zone:
    ``2026-12-01T03:14:15``); None for "Unknown", "N/A", "NONE" or nothing.

    Raises `ValueError` for anything else.
    """
    value = text.strip()
    if value.lower() in _NO_TIME:
        return None
    try:
        # A naive datetime's timestamp() is local time, as Slurm's output is.
        return datetime.fromisoformat(value).timestamp()
    except (OverflowError, OSError) as exc:
        raise ValueError(f"{value!r} is out of range") from exc


def parse_task_ids(text: str) -> list[int]:
    """``3``, ``0-2``, ``1,3``, ``0-7%2`` (a throttle) -> task ids; anything else -> none."""
    ids: list[int] = []
    for part in text.split("%")[0].split(","):
        low, dash, high = part.partition("-")
        if low.isdigit() and (not dash or high.isdigit()):
            ids.extend(range(int(low), int(high or low) + 1))
    return ids


@dataclass(frozen=True)
class TaskState:
    """Where an array task stands: Slurm's state word, the exit code ("75:0"), the node
    its batch script ran on (None: not yet, or Slurm did not say) and, for a pending task
    Slurm holds after a failed launch, `LAUNCH_HELD`."""

    state: str
    exit_code: str
    node: str | None = None
    reason: str | None = None

    @property
    def text(self) -> str:
        """``FAILED 75:0``, or ``PENDING 0:0 launch_failed_requeued_held``: the form the
        submission journal keeps."""
        return " ".join([self.state, self.exit_code, *([self.reason] if self.reason else [])])

    @classmethod
    def from_text(cls, text: str, node: str | None = None) -> TaskState:
        """The state `text` wrote."""
        state, _, rest = text.partition(" ")
        code, _, reason = rest.partition(" ")
        return cls(state, code, node, reason or None)

    @property
    def launch_held(self) -> bool:
        """Pending, held by Slurm after its launch failed: it never starts by itself."""
        return self.state == "PENDING" and self.reason == LAUNCH_HELD

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


@dataclass(frozen=True)
class JobRecord:
    """A job, an array task or a group of an array's pending tasks: one line of
    ``scontrol -o show job`` or of the job completion log (jobcomp/filetxt)."""

    job_id: str
    name: str = ""
    array_job_id: str | None = None
    array_tasks: tuple[int, ...] | None = None  # None: not a task of an array
    state: str = "?"
    exit_code: str = "?"
    end: str | None = None  # EndTime as printed; None: the line has none
    submit: str | None = None  # SubmitTime as printed; None: the line has none
    start: str | None = None  # StartTime as printed; None: the line has none
    batch_host: str | None = None  # the node the batch script runs on, once it runs
    nodes: str | None = None  # NodeList as printed (``hn2``, ``hn[1-2]``); None: none yet
    restarts: int = 0  # how often Slurm requeued the job (its SLURM_RESTART_COUNT)
    reason: str | None = None  # Reason=, kept only when it is `LAUNCH_HELD`

    @property
    def base_id(self) -> str:
        """The array's id for one of its tasks, else the job's own."""
        return self.array_job_id or self.job_id

    @property
    def tasks(self) -> tuple[int, ...]:
        """The array tasks the record stands for; a job outside an array is task 0."""
        return (0,) if self.array_tasks is None else self.array_tasks

    @property
    def node(self) -> str | None:
        """The node its batch script ran on: BatchHost, else a NodeList of one node (the
        job completion log has no BatchHost)."""
        if self.batch_host is not None:
            return self.batch_host
        return one_node(self.nodes)

    @property
    def task_state(self) -> TaskState:
        return TaskState(self.state, self.exit_code, self.node, self.reason)

    def end_time(self) -> float | None:
        """The end time in epoch seconds, None for none (UNLIMITED, pending); `ValueError`
        when the line has no EndTime= or it is not a timestamp."""
        if self.end is None:
            raise ValueError(f"no EndTime= in the record of job {self.job_id}")
        return parse_slurm_time(self.end)

    def queue_times(self) -> tuple[float | None, float | None]:
        """When the job was submitted and when it started (epoch seconds), each None where
        the line does not say; `ValueError` for one that is not a timestamp."""
        submitted = None if self.submit is None else parse_slurm_time(self.submit)
        return submitted, None if self.start is None else parse_slurm_time(self.start)


def parse_job_records(text: str) -> list[JobRecord]:
    """The records of ``scontrol -o show job`` or of the job completion log: one a line of
    ``Key=Value`` words; a line without ``JobId=`` is none."""
    records = []
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for word in line.split():
            key, sep, value = word.partition("=")
            if sep:
                # The first wins: Slurm prints its own keys before a job's free text
                # (Command=, WorkDir=, Comment=), which may hold words like them.
                fields.setdefault(key, value)
        if "JobId" not in fields:
            continue
        tasks = fields.get("ArrayTaskId")
        records.append(
            JobRecord(
                job_id=fields["JobId"],
                name=fields.get("JobName", fields.get("Name", "")),
                array_job_id=fields.get("ArrayJobId"),
                array_tasks=None if tasks is None else tuple(parse_task_ids(tasks)),
                state=fields.get("JobState", "?"),
                exit_code=fields.get("ExitCode", "?"),
                end=fields.get("EndTime"),
                submit=fields.get("SubmitTime"),
                start=fields.get("StartTime"),
                batch_host=_known_host(fields.get("BatchHost")),
                nodes=_known_host(fields.get("NodeList")),
                restarts=int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else 0,
                reason=LAUNCH_HELD if fields.get("Reason") == LAUNCH_HELD else None,
            )
        )
    return records


def _known_host(text: str | None) -> str | None:
    return None if text is None or text.lower() in _NO_TIME | {"(null)", "none assigned"} else text


def one_node(node_list: str | None) -> str | None:
    """The node of a node list that names exactly one (``hn2``); None for none, or for a
    list of several (``hn[1-2]``, ``hn1,hn2``)."""
    if node_list is None or not node_list or any(c in node_list for c in "[],"):
        return None
    return node_list


def record_of(records: list[JobRecord], job_id: str) -> JobRecord | None:
    """The record whose JobId= is `job_id` (``show job`` of an array lists every task)."""
    return next((record for record in records if record.job_id == job_id), None)


def parse_scontrol_end_time(stdout: str, job_id: str) -> float | None:
    """The end time from ``scontrol -o show job J``: the ``EndTime=`` of the record whose
    ``JobId=`` is J. Raises `ValueError` when there is none, or it is not a timestamp."""
    record = record_of(parse_job_records(stdout), job_id)
    if record is None:
        raise ValueError(f"no record of job {job_id}")
    return record.end_time()


def parse_squeue_end_time(stdout: str, job_id: str) -> float | None:
    """The end time from ``squeue -h -j J -o '%A %e'``: the line whose job id is J.

    ``squeue -j`` of an array's base id lists every task of the array, each under its
    own job id (``%A``), so the line is picked by id. Raises `ValueError` when no line
    is J's or its time is not a timestamp.
    """
    for line in stdout.splitlines():
        fields = line.split()
        if fields and fields[0] == job_id:
            return parse_slurm_time(fields[1] if len(fields) > 1 else "")
    raise ValueError(f"no line for job {job_id}")


def parse_squeue_job_ids(stdout: str) -> set[str]:
    """The job ids of ``squeue -h -o %F`` (an array's tasks share theirs)."""
    return {line.strip() for line in stdout.splitlines() if line.strip().isdigit()}


def parse_squeue_states(stdout: str) -> dict[str, str]:
    """Job id -> state from ``squeue -h -o '%i %T'``."""
    return {
        fields[0]: fields[1]
        for fields in (line.split() for line in stdout.splitlines())
        if len(fields) == 2
    }


def parse_sacct_job_ids(stdout: str) -> set[str]:
    """The job ids of ``sacct -X -P -n -o JobID``, an array's tasks (``77_0``) under the
    array's id."""
    return {word.split("_")[0] for word in stdout.split() if word[:1].isdigit()}


def parse_sacct_tasks(stdout: str, job_id: str) -> dict[int, TaskState]:
    """The tasks of array `job_id` in ``sacct -X -P -n -o JobID,State,ExitCode,NodeList``
    (NodeList may be left out); a pending group (``9_[3-4]``) stands for each of its
    tasks."""
    states: dict[int, TaskState] = {}
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) not in (3, 4) or not parts[0].startswith(f"{job_id}_"):
            continue
        state = parts[1].split()[0] if parts[1] else "?"  # "CANCELLED by 0"
        node = one_node(_known_host(parts[3])) if len(parts) == 4 else None
        for task in parse_task_ids(parts[0].partition("_")[2].strip("[]")):
            states.setdefault(task, TaskState(state, parts[2], node))
    return states


def parse_config(stdout: str) -> dict[str, str]:
    """The settings of ``scontrol show config`` (``Name = value`` lines)."""
    return {
        key.strip(): value.strip()
        for key, sep, value in (line.partition("=") for line in stdout.splitlines())
        if sep
    }
