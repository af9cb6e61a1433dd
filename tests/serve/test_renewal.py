"""Renewal's arithmetic without Slurm: when a successor becomes eligible and for how long,
the deadline every job of the chain keeps, and `--until`/`--renew-lead` refused in one line."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pytest_haico.cli.main import main
from pytest_haico.config.settings import Profile
from pytest_haico.errors import ConfigError
from pytest_haico.serve.job import _parser as job_parser
from pytest_haico.serve.renewal import (
    Renewal,
    Successor,
    drain,
    is_idle,
    plan_successor,
    resolve_renewal,
)
from pytest_haico.serve.submission import ModelJob, queue_successor, sbatch_argv
from tests.unit_slurm.commands import stand_ins

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def test_without_until_there_is_no_renewal_and_the_lead_defaults_below_the_time() -> None:
    assert resolve_renewal(time="3", until=None, lead=None, now=NOW) is None
    assert resolve_renewal(time="8:00:00", until="1-00:00:00", lead=None, now=NOW) == Renewal(
        until=NOW + timedelta(days=1), lead_min=15
    )
    assert resolve_renewal(time="20", until="60", lead=None, now=NOW) == Renewal(
        until=NOW + _minutes(60), lead_min=10
    )
    assert resolve_renewal(time="3", until="10", lead="2", now=NOW) == Renewal(
        until=NOW + _minutes(10), lead_min=2
    )


@pytest.mark.parametrize(
    ("time", "until", "lead", "message"),
    [
        ("3", "2", None, "--until: 2 is shorter than --time 3: serve for --time alone"),
        ("3", "10", "3", "--renew-lead: 3 min is not between 1 min and --time 3 (3 min)"),
        ("3", "10", "0", "--renew-lead: 0 min is not between 1 min and --time 3 (3 min)"),
        ("1", "10", None, "--renew-lead: 0 min is not between 1 min and --time 1 (1 min)"),
        (None, "10", None, "--until: renewal needs each job's time limit: give --time"),
        ("3", None, "2", "--renew-lead: renews only a service with --until"),
        ("3", "UNLIMITED", None, "--until: 'UNLIMITED' is no end: give the total service time"),
        ("3", "soon", None, "--until: 'soon' is not a Slurm time limit"),
    ],
)
def test_a_renewal_that_cannot_be_met_is_refused_naming_the_option(
    time: str | None, until: str | None, lead: str | None, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        resolve_renewal(time=time, until=until, lead=lead, now=NOW)
    assert str(refused.value).startswith(message)


def test_the_successor_is_eligible_the_lead_before_the_end_until_the_deadline() -> None:
    renewal = Renewal(until=NOW + _minutes(10), lead_min=2)
    # Eligible 1 min after the start (2 min before the end of 3), for a whole 3 min.
    assert plan_successor(started=NOW, time_min=3, renewal=renewal) == Successor(1, 3)
    # Eligible at 7.5 min: 2.5 min are left, so its time limit is cut to 2 whole minutes...
    assert plan_successor(started=NOW + _minutes(6.5), time_min=3, renewal=renewal) == Successor(
        1, 2
    )
    # ... which leave no minute before its lead: the chain ends with it.
    assert plan_successor(started=NOW + _minutes(7.5), time_min=2, renewal=renewal) is None
    # A job that ends at the deadline, or after it, queues none.
    assert plan_successor(started=NOW + _minutes(7), time_min=3, renewal=renewal) is None
    assert Successor(1, 3).dependency("41") == "--dependency=after:41+1"


def test_the_successor_is_submitted_alike_with_its_dependency_and_the_absolute_deadline(
    tmp_path: Path,
) -> None:
    job = ModelJob(
        arm_file=tmp_path / "arms" / "standin.toml",
        name="judge",
        profile=Profile.LOCAL,
        catalogue=tmp_path / "catalogue",
        file_mode=0o640,
        python="/venv/bin/python",
        time="3",
        resources=("--partition=gpu",),
        renewal=Renewal(until=NOW + _minutes(10), lead_min=2),
    )
    argv = sbatch_argv(job, after="--dependency=after:41+1")
    assert argv[:4] == ["sbatch", "--parsable", "--nodes=1", "--partition=gpu"]
    assert argv[argv.index("--time=3") + 1] == "--dependency=after:41+1"
    tail = argv[argv.index("--arm-file") :]
    assert tail[-6:] == ["--time", "3", "--until", "2026-12-04T12:10:00+00:00", "--renew-lead", "2"]
    args = job_parser().parse_args(tail)  # the job reads back what it was given
    assert (args.time, args.until, args.renew_lead) == ("3", NOW + _minutes(10), 2)
    assert args.name == "judge" and args.file_mode == 0o640


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "project"
    subprocess.run(
        [sys.executable, "-m", "pytest_haico", "init", str(root)], check=True, capture_output=True
    )
    monkeypatch.chdir(root)
    monkeypatch.setenv("CLUSTER_WORK", str(tmp_path / "work"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))  # nothing may be submitted
    return root


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("--time", "3", "--until", "2"),
            "haico: --until: 2 is shorter than --time 3: serve for --time alone",
        ),
        (
            ("--time", "3", "--until", "10", "--renew-lead", "3"),
            "haico: --renew-lead: 3 min is not between 1 min and --time 3 (3 min): the "
            "successor must be queued before this job ends",
        ),
    ],
)
def test_haico_serve_refuses_a_bad_renewal_in_one_line_before_submitting(
    project: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], line: str
) -> None:
    status = main(["serve", "standin", "--profile", "local", *args])
    captured = capsys.readouterr()
    assert (status, (captured.out + captured.err).splitlines()) == (2, [line])


@pytest.fixture
def metrics() -> Iterator[tuple[str, list[str]]]:
    """A `/metrics` on loopback answering with the text in the list (its last item)."""
    texts = [""]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = texts[-1].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", texts
    finally:
        server.shutdown()
        server.server_close()


def test_a_replaced_server_is_idle_only_when_it_runs_and_queues_no_request(
    metrics: tuple[str, list[str]],
) -> None:
    url, texts = metrics
    busy = 'vllm:num_requests_running{model_name="standin",engine="0"} %s\n'
    waiting = 'vllm:num_requests_waiting{model_name="standin",engine="0"} %s\n'
    texts.append(busy % 1 + waiting % 0)
    assert not is_idle(url, "key")
    texts.append(busy % 0 + waiting % 2)
    assert not is_idle(url, "key")
    texts.append("# HELP vllm:num_requests_running ...\n" + busy % 0 + waiting % 0)
    assert is_idle(url, "key")


def test_a_drain_ends_when_idle_at_its_limit_or_when_it_is_ended() -> None:
    looks: list[int] = []

    def idle_at_third_look() -> bool:
        looks.append(1)
        return len(looks) >= 3

    assert drain(idle_at_third_look, ended=lambda: False) == "idle" and len(looks) == 3
    # Requests that never finish: the drain gives up at its limit (DRAIN_LIMIT_S in a job).
    waits = threading.Event()
    assert drain(lambda: False, ended=lambda: waits.wait(0.01), limit_s=0.05) == "limit"
    assert drain(lambda: False, ended=lambda: True) == "ended"  # a signal, a dead server


def test_a_job_queues_one_successor_unless_one_is_pending_already(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requeued job registers again: the successor its first run queued is still pending.
    A running job of the name (a predecessor still draining) is no successor."""
    job = ModelJob(
        arm_file=tmp_path / "standin.toml",
        name="judge",
        profile=Profile.LOCAL,
        catalogue=tmp_path / "catalogue",
        file_mode=0o640,
        python="/venv/bin/python",
        time="3",
        renewal=Renewal(until=NOW + _minutes(10), lead_min=2),
    )
    queue = tmp_path / "queue"
    env = stand_ins(tmp_path, squeue=f'echo "$(< {queue})"', sbatch="echo 13")
    monkeypatch.setenv("PATH", env["PATH"])
    queue.write_text("7 RUNNING\n6 RUNNING\n")
    assert queue_successor(job, "7", started=NOW) == (
        "queued job 13 to start 1 min after this job started, for 3 min "
        "(until 2026-12-04T12:10:00+00:00)"
    )
    sbatch = (tmp_path / "sbatch.argv").read_text().splitlines()
    assert "--dependency=after:7+1" in sbatch and "--job-name=haico.serve.judge" in sbatch
    (tmp_path / "sbatch.argv").unlink()
    queue.write_text("7 RUNNING\n13 PENDING\n")
    assert queue_successor(job, "7", started=NOW) == "no successor: job 13 is queued already"
    assert queue_successor(job, "7", started=NOW + _minutes(7)) == (
        "no successor: the service ends with this job (until 2026-12-04T12:10:00+00:00)"
    )
    assert not (tmp_path / "sbatch.argv").exists()
