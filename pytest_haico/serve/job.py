"""The model job of `haico serve`: `python -m pytest_haico.serve.job`, run by the batch
script `templates/serve.sbatch` (which forwards USR1 to it, and survives TERM so that this
process can deregister before SIGKILL).

It starts the arm's model server as a campaign's stack would (`stack.arm_stack.
build_model_service`, the same health wait), on every interface of its node (the key
guards it), on either profile: its clients run on other nodes (a campaign's backend
reaches it through its relay, a judge's scorer directly). Once healthy it registers
`<catalogue>/<name>.json` under its node's name, and its key file, queues its
successor when it renews (`serve.renewal`), then waits: for TERM (the time limit,
`scancel`, a requeue), USR1 (Slurm's warning before the end, `haico serve stop`), INT or
HUP, the model server's death, or its successor's entry in its place (then it drains). On
every end it deregisters its own entry (never a successor's) before the server stops.

Exit: 0 ended by a signal or replaced, 75 the model server died (infrastructure: serve it again),
78 it never became healthy, 4 a bad request (an arm or cluster.env that does not load).
"""

from __future__ import annotations

import argparse
import logging
import os
import pwd
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from pytest_haico import httpclient
from pytest_haico.config.cluster_env import ClusterEnv, load_cluster_env
from pytest_haico.config.experiment import Arm, load_arm
from pytest_haico.config.identity import model_identity
from pytest_haico.config.settings import Profile
from pytest_haico.config.slurm import SlurmJob
from pytest_haico.errors import CatalogueError, HaicoError
from pytest_haico.serve.catalogue import (
    CatalogueEntry,
    EntryJob,
    EntryOwner,
    ServedIdentity,
    deregister,
    key_file_name,
    now_utc,
    read_entry,
    register,
)
from pytest_haico.serve.renewal import DRAIN_LIMIT_S, Renewal, drain, is_idle, minutes
from pytest_haico.serve.submission import ModelJob, queue_successor
from pytest_haico.slurm.client import SlurmError
from pytest_haico.slurm.jobs import job_end_time
from pytest_haico.slurm.timelimits import parse_time_limit
from pytest_haico.stack.arm_stack import build_model_service
from pytest_haico.stack.orchestrator import Orchestrator
from pytest_haico.stack.service import new_secret
from pytest_haico.stamps import utc_iso

_log = logging.getLogger("haico.serve")
POLL_S = 0.5  # how often the job looks at its model server
EXIT_SIGNALLED, EXIT_USAGE, EXIT_DIED, EXIT_NOT_STARTED = 0, 4, 75, 78
_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s haico serve: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health probe
    args = _parser().parse_args(argv)
    begun = datetime.now(UTC)
    stop = threading.Event()
    signalled: list[str] = []
    orchestrator: Orchestrator | None = None

    def on_signal(signum: int, frame: object) -> None:
        signalled.append(signal.Signals(signum).name)
        stop.set()
        if orchestrator is not None:
            orchestrator.interrupt(f"{signalled[-1]} while the model server was starting")

    for sig in _SIGNALS:
        signal.signal(sig, on_signal)
    try:
        job = SlurmJob.from_environ(os.environ)
        if job.job_id is None:
            raise HaicoError("not in a Slurm job (no SLURM_JOB_ID): `haico serve` submits one")
        arm = load_arm(args.arm_file)
        site = load_cluster_env(args.cluster_env) if args.cluster_env else None
    except HaicoError as exc:
        _log.error("%s", exc)
        return EXIT_USAGE
    profile = Profile(args.profile)
    api_key = new_secret()
    try:
        service = build_model_service(
            arm,
            profile=profile,
            api_key=api_key,
            site=site,
            host="0.0.0.0",
        )
        log_dir = args.log_dir / f"{args.name}.{_job_key(job)}"
        orchestrator = Orchestrator([service], log_dir, log_mode=args.file_mode, poll_interval=0.1)
        if stop.is_set():
            orchestrator.interrupt(f"{signalled[-1]} before the model server was started")
        orchestrator.start()
    except HaicoError as exc:
        _log.error("the model server did not start: %s", exc)
        return EXIT_SIGNALLED if signalled else EXIT_NOT_STARTED
    catalogue, name, job_id = args.catalogue, args.name, _job_key(job)
    restarts = job.restart_count
    try:
        port = orchestrator.port(service.name)
        entry = _entry(args, arm, job, port=port, profile=profile, site=site)
        register(catalogue, entry, api_key, file_mode=args.file_mode, key_group=args.key_group)
        _log.info(
            "registered %s: %s serves %s (arm %s) for job %s until %s",
            name,
            entry.endpoint,
            entry.served_name,
            arm.name,
            job_id,
            entry.job.end_time or "no time limit",
        )
        if args.until is not None and not stop.is_set():
            _renew(args, arm, job_id, started=_started(entry, args.time, begun))
        server, metrics = orchestrator, f"http://127.0.0.1:{port}/metrics"
        status, why = _wait(
            stop,
            server,
            signalled,
            replaced=replaced_by(catalogue, name, entry.job),
            drain=lambda: _drain(stop, server, metrics, api_key),
        )
    except HaicoError as exc:
        status, why = EXIT_DIED, f"could not register: {exc}"
    finally:
        removed = deregister(catalogue, name, job_id=job_id, restart_count=restarts)
        _log.info("deregistered %s" if removed else "%s: no entry of this job to remove", name)
        orchestrator.stop()
    _log.info("stopped (%s)", why)
    return status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pytest_haico.serve.job")
    parser.add_argument("--arm-file", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--profile", choices=[p.value for p in Profile], required=True)
    parser.add_argument("--catalogue", type=Path, required=True)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--file-mode", type=lambda text: int(text, 8), required=True)
    parser.add_argument("--cluster-env", type=Path)
    parser.add_argument("--key-group")
    parser.add_argument("--time")
    parser.add_argument("--until", type=datetime.fromisoformat)
    parser.add_argument("--renew-lead", type=int)
    return parser


def _started(entry: CatalogueEntry, time_limit: str | None, begun: datetime) -> datetime:
    """When Slurm started the job: its end less its time limit (as Slurm counts from);
    the process's own start when Slurm did not say."""
    if entry.job.end_time is None or time_limit is None:
        return begun
    return datetime.fromisoformat(entry.job.end_time) - timedelta(
        minutes=minutes(parse_time_limit(time_limit, where="--time") or 0)
    )


def _renew(args: argparse.Namespace, arm: Arm, job_id: str, *, started: datetime) -> None:
    """Queue this job's successor, as it was submitted, unless the deadline has come."""
    model_job = ModelJob(
        arm_file=args.arm_file,
        name=args.name,
        profile=Profile(args.profile),
        catalogue=args.catalogue,
        file_mode=args.file_mode,
        python=sys.executable,
        time=args.time,
        resources=tuple(arm.slurm.resource_options()) if arm.slurm is not None else (),
        cluster_env=args.cluster_env,
        key_group=args.key_group,
        renewal=Renewal(until=args.until, lead_min=args.renew_lead),
    )
    try:
        _log.info("renewal: %s", queue_successor(model_job, job_id, started=started))
    except HaicoError as exc:
        _log.error("renewal: the successor could not be queued: %s", exc)


def replaced_by(catalogue: Path, name: str, ours: EntryJob) -> Callable[[], str | None]:
    """A check: which job holds this job's place in the catalogue now, else None. That is
    another job (a successor), or this job itself run again elsewhere: Slurm requeued it
    after its node stopped answering, while this process kept running there."""

    def check() -> str | None:
        try:
            holder = read_entry(catalogue, name).job
        except CatalogueError:
            return None  # gone or unreadable: nobody took over
        if holder.id != ours.id:
            return f"job {holder.id}"
        if holder.restart_count != ours.restart_count or holder.node != ours.node:
            where = f"{holder.node} (restart {holder.restart_count})"
            return f"job {holder.id} itself, requeued onto {where}"
        return None

    return check


def _drain(stop: threading.Event, orchestrator: Orchestrator, metrics: str, key: str) -> None:
    """Until the server runs no request, at most `DRAIN_LIMIT_S` (a signal ends it too)."""
    outcome = drain(
        lambda: is_idle(metrics, key),
        ended=lambda: stop.wait(POLL_S) or _died(orchestrator) is not None,
    )
    if outcome == "limit":
        _log.warning("drained: requests still running after %.0f s", DRAIN_LIMIT_S)
    elif outcome == "idle":
        _log.info("drained: no request running")


def _job_key(job: SlurmJob) -> str:
    key = job.key
    assert key is not None
    return key


def _entry(
    args: argparse.Namespace,
    arm: Arm,
    job: SlurmJob,
    *,
    port: int,
    profile: Profile,
    site: ClusterEnv | None,
) -> CatalogueEntry:
    """What this job registers: where its server answers, what it serves, until when."""
    job_id = _job_key(job)
    uid = os.geteuid()
    return CatalogueEntry(
        name=args.name,
        host=job.node,
        port=port,
        served_name=arm.served_name,
        identity=ServedIdentity(
            model=model_identity(arm, profile=profile),
            vllm=arm.vllm.model_dump(mode="json"),
            vllm_version=_vllm_version(port),
        ),
        job=EntryJob(
            id=job_id, node=job.node, restart_count=job.restart_count, end_time=_end_time(job_id)
        ),
        owner=EntryOwner(uid=uid, name=_user_name(uid)),
        arm=arm.name,
        registered_at=now_utc(),
        key_file=key_file_name(args.name, job_id, job.restart_count),
    )


def _vllm_version(port: int) -> str | None:
    """What the server's `GET /version` says (vLLM's, and the stand-in's); None if nothing."""
    try:
        answer = httpclient.get(f"http://127.0.0.1:{port}/version", timeout=5.0)
        version = answer.json().get("version") if answer.is_success else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return str(version) if version else None


def _end_time(job_id: str) -> str | None:
    """The job's end (its time limit) in UTC; None for none, or when Slurm cannot say."""
    try:
        end = job_end_time(job_id)
    except SlurmError as exc:
        _log.warning("the entry gets no end time: %s", exc)
        return None
    if end is None:
        return None
    return utc_iso(end)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _wait(
    stop: threading.Event,
    orchestrator: Orchestrator,
    signalled: list[str],
    *,
    replaced: Callable[[], str | None],
    drain: Callable[[], None],
) -> tuple[int, str]:
    """Until a signal, the model server's death or a successor's entry (then `drain`): the
    exit status and why."""
    while not stop.wait(POLL_S):
        died = _died(orchestrator)
        if died is not None:
            _log.error("%s", died)
            return EXIT_DIED, died
        successor = replaced()
        if successor is not None:
            _log.info("replaced by %s: draining", successor)
            drain()
            return EXIT_SIGNALLED, f"replaced by {successor}"
    return EXIT_SIGNALLED, signalled[-1] if signalled else "a signal"


def _died(orchestrator: Orchestrator) -> str | None:
    """What ended the model server, if it ended."""
    for name, process in orchestrator.processes.items():
        status = process.exit_status()
        if status is not None:
            return f"{name} (pid {process.pid}) ended with status {status}"
    return None


if __name__ == "__main__":
    sys.exit(main())
