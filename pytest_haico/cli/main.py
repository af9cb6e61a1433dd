"""`haico`: the campaign's operations on a login node (also `python -m pytest_haico`).

    haico cost <results>/<campaign> [--concurrency N] [--margin 1.5]
    haico submit <campaign> --stage smoke|full [--arm A] [--time T] [--tasks N] [--dry-run]
    haico continue <campaign> [--tasks M] [--dry-run]
    haico report <results>/<campaign> [--html out.html]
    haico compare <A> <B> [--exit-on-regression]
    haico init <dir>
    haico stack up <arm> | status [ARM|FILE] | down ARM|FILE

Every error is one line on stderr and exit 2; nothing here prints a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from pytest_haico.errors import HaicoError

if TYPE_CHECKING:
    from pytest_haico.cli.jobs import Request

USAGE_ERROR = 2


def console() -> NoReturn:
    """The `haico` command (the console script, and `python -m pytest_haico`)."""
    sys.exit(main(hard_exit=True))


def main(argv: Sequence[str] | None = None, *, hard_exit: bool = False) -> int:
    """Run one command; the exit status. `hard_exit` (the command's own process): a report
    or a comparison ends the process once it is printed, without freeing the records it
    read (half a second per 100,000 records; mypy does the same)."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.finish = _exit_now if hard_exit else None
    try:
        return int(args.run(args))
    except HaicoError as exc:
        print(f"haico: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except BrokenPipeError:  # the reader went away (`haico report | head`): stop quietly
        # What is still buffered would fail again at exit: it goes nowhere instead.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # a results directory this user cannot read or write
        print(f"haico: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("haico: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="haico",
        description="Campaign operations for pytest-haico: cost, staged submission, continuation.",
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    cost = commands.add_parser(
        "cost", help="measured item costs and the array size and --time to ask for"
    )
    cost.add_argument("campaign", help="the campaign directory, <results>/<campaign>")
    cost.add_argument("--concurrency", type=_positive_int, help="instead of each arm's")
    cost.add_argument(
        "--margin", type=_margin, default=1.5, help="factor on the measured work (default 1.5)"
    )
    _add_project_options(cost)
    cost.set_defaults(run=_run_cost)

    submit = commands.add_parser("submit", help="freeze the inputs and submit one stage")
    submit.add_argument("campaign", help="campaign name (under the results root) or directory")
    submit.add_argument("--stage", required=True, choices=("smoke", "full", "continue"))
    submit.add_argument("--arm", action="append", default=[], help="only this arm (repeatable)")
    submit.add_argument(
        "--stratum", action="append", default=[], help="only this stratum (repeatable)"
    )
    submit.add_argument("--limit", type=_positive_int, default=2, help="smoke: items per task")
    submit.add_argument(
        "--profile", choices=("local", "cluster"), help="default: cluster with a cluster.env"
    )
    submit.add_argument(
        "--sbatch",
        type=Path,
        help="default: <project>/sbatch/campaign.sbatch, else the one pytest-haico ships",
    )
    _add_job_options(submit)
    _add_project_options(submit)
    submit.set_defaults(run=_run_submit)

    cont = commands.add_parser(
        "continue", help="resubmit what the newest submission's jobs left unfinished"
    )
    cont.add_argument("campaign", help="campaign name (under the results root) or directory")
    cont.add_argument("--submission", help="this submission instead of the newest")
    _add_job_options(cont)
    _add_project_options(cont)
    cont.set_defaults(run=_run_continue)

    report = commands.add_parser(
        "report", help="verdicts, turns, latency, tokens and provenance per arm × stratum"
    )
    report.add_argument("campaign", help="the campaign directory, <results>/<campaign>")
    report.add_argument(
        "--html", type=Path, metavar="FILE", help="also write a self-contained HTML report"
    )
    report.set_defaults(run=_run_report)

    compare = commands.add_parser(
        "compare", help="verdict changes, latency and token deltas, provenance differences"
    )
    compare.add_argument(
        "a",
        metavar="A",
        help="baseline: a campaign or arm directory, a run (DIR@RUN_ID, "
        "<arm>/runs/<run_id> or <arm>/ledger/<run_id>.jsonl)",
    )
    compare.add_argument("b", metavar="B", help="the one compared with A, in the same forms")
    compare.add_argument(
        "--exit-on-regression",
        action="store_true",
        help="exit 1 when an item completed in A and not in B",
    )
    compare.set_defaults(run=_run_compare)

    init = commands.add_parser(
        "init", help="write a new experiments repository that runs on the local profile"
    )
    init.add_argument("dir", type=Path, help="a new (or empty) directory")
    init.set_defaults(run=_run_init)
    _add_stack_commands(commands)
    return parser


def _add_stack_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stack = commands.add_parser(
        "stack", help="keep an arm's stack up between pytest runs (pytest --haico-attach)"
    )
    actions = stack.add_subparsers(required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start the arm's stack under a supervisor, kept up")
    up.add_argument("arm", help="the arm's name (experiments/arms/<arm>.toml)")
    up.add_argument(
        "--profile",
        choices=("local", "cluster"),
        default="local",
        help="as pytest's --haico-profile (default: local)",
    )
    up.add_argument(
        "--campaign",
        default="default",
        help="the services' logs and dumps go to <results>/<campaign>/<arm>/kept/ "
        "(default: default)",
    )
    up.add_argument("--backend-cmd", help="as pytest's --haico-backend-cmd")
    up.add_argument("--backend-image", help="as pytest's --haico-backend-image (cluster profile)")
    up.add_argument(
        "--dump-interval",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="seconds between two pg_dumps (default: 900; 0: only the final one)",
    )
    _add_project_options(up)
    up.set_defaults(run=_run_stack_up)
    status = actions.add_parser(
        "status", help="what runs, since when, on which ports, with which settings, how healthy"
    )
    status.add_argument("target", nargs="?", metavar="ARM|FILE", help="default: every kept stack")
    status.set_defaults(run=_run_stack_status)
    down = actions.add_parser("down", help="final dump, then stop every service")
    down.add_argument("target", metavar="ARM|FILE", help="the arm, or its state file")
    down.set_defaults(run=_run_stack_down)


def _add_job_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--time", help="walltime per task (Slurm's format), instead of measured")
    parser.add_argument("--tasks", type=_positive_int, help="array tasks, instead of measured")
    parser.add_argument(
        "--margin", type=_margin, default=1.5, help="factor on the measured work (default 1.5)"
    )
    parser.add_argument(
        "--force",
        action="append",
        default=[],
        metavar="JOB",
        help="resubmit this job although its earlier submission left no trace",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the sbatch command lines, write nothing"
    )


def _add_project_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--experiments", type=Path, help="where arms/ and scripts/ are (default: ./experiments)"
    )
    parser.add_argument("--cluster-env", type=Path, help="default: <experiments>/cluster.env")
    parser.add_argument(
        "--results",
        type=Path,
        help="results root (default: $CLUSTER_WORK/results, else <project>/results)",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def _margin(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 1 <= value < 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a factor from 1 to 100")
    return value


def _campaign_dir(args: argparse.Namespace) -> Path:
    """A path names the campaign directory; a bare name is under the results root."""
    given = str(args.campaign)
    if os.sep in given or given in (".", ".."):
        return Path(given).resolve()
    if args.results is not None:
        return (Path(args.results) / given).resolve()
    work = os.environ.get("CLUSTER_WORK") or _site_value(args, "CLUSTER_WORK")
    if work:
        return (Path(work) / "results" / given).resolve()
    return (_experiments(args).parent / "results" / given).resolve()


def _experiments(args: argparse.Namespace) -> Path:
    return (args.experiments or Path("experiments")).resolve()


def _site_value(args: argparse.Namespace, key: str) -> str | None:
    from pytest_haico.config.cluster_env import load_cluster_env

    path = args.cluster_env or _experiments(args) / "cluster.env"
    return load_cluster_env(path).get(key) if path.is_file() else None


def _run_init(args: argparse.Namespace) -> int:
    from pytest_haico.cli.init import init

    target = Path(args.dir)
    for path in init(target):
        print(f"haico: wrote {path}")
    print(
        f"haico: next: cd {target} && pytest experiments (the local profile: a real "
        "Postgres and the stand-ins); then, on a cluster, haico submit <campaign> --stage "
        "smoke --dry-run"
    )
    return 0


def _run_stack_up(args: argparse.Namespace) -> int:
    from pytest_haico.cli.stack import up
    from pytest_haico.config.settings import Profile

    experiments = _experiments(args)
    work = os.environ.get("CLUSTER_WORK") or _site_value(args, "CLUSTER_WORK")
    results = args.results or (Path(work) / "results" if work else experiments.parent / "results")
    cluster_env = args.cluster_env or experiments / "cluster.env"
    return up(
        args.arm,
        experiments=experiments,
        profile=Profile(args.profile),
        cluster_env=cluster_env.resolve() if cluster_env.is_file() else None,
        campaign_dir=Path(results).resolve() / args.campaign,
        backend_command=args.backend_cmd,
        backend_image=args.backend_image,
        dump_interval_s=args.dump_interval,
        file_mode=0o640,
        say=print,
    )


def _run_stack_status(args: argparse.Namespace) -> int:
    from pytest_haico.cli.stack import status

    return status(args.target, say=print)


def _run_stack_down(args: argparse.Namespace) -> int:
    from pytest_haico.cli.stack import down

    return down(args.target, say=print)


def _run_cost(args: argparse.Namespace) -> int:
    from pytest_haico.cli import cost, slurm
    from pytest_haico.cli.timelimits import Partition, read_partitions

    campaign_dir = _campaign_dir(args)
    try:
        partitions: list[Partition] | None = read_partitions()
    except slurm.SlurmError:
        partitions = None
    experiments = _experiments(args) if args.experiments or Path("experiments").is_dir() else None
    for line in cost.cost_lines(
        campaign_dir,
        experiments,
        concurrency=args.concurrency,
        margin=args.margin,
        partitions=partitions,
        warn=lambda message: print(f"haico: ledger warning: {message}", file=sys.stderr),
    ):
        print(line)
    return 0


def _run_submit(args: argparse.Namespace) -> int:
    if args.stage == "continue":
        return _run_continue(args)
    from pytest_haico.cli import submit
    from pytest_haico.cli.inputs import Sources

    sources = Sources.find(_experiments(args), cluster_env=args.cluster_env, script=args.sbatch)
    profile = args.profile or ("cluster" if sources.cluster_env is not None else "local")
    return submit.submit(
        _campaign_dir(args),
        sources,
        args.stage,
        _request(args),
        profile=profile,
        say=print,
    )


def _run_continue(args: argparse.Namespace) -> int:
    from pytest_haico.cli.continuation import continue_
    from pytest_haico.cli.inputs import InputsError, load_submission, newest_submission

    campaign_dir = _campaign_dir(args)
    if not campaign_dir.is_dir():
        raise InputsError(
            f"{campaign_dir} is no campaign directory: give <results>/<campaign>, or the "
            "campaign's name with --results"
        )
    name = getattr(args, "submission", None)
    if name:
        if not (len(name) == 12 and all(c in "0123456789abcdef" for c in name)):
            raise InputsError(
                f"--submission {name!r}: a submission is named by 12 hex digits, as under "
                f"{campaign_dir}/submissions/"
            )
        found = load_submission(campaign_dir, name)
        if found is None:
            raise InputsError(f"{campaign_dir} has no submission {name}")
        submission = found
    else:
        submission = newest_submission(campaign_dir)
    print(f"haico: submission {submission.name} ({submission.digest})")
    return continue_(submission, _request(args), say=print)


def _run_report(args: argparse.Namespace) -> int:
    from pytest_haico.cli.report import run_report

    return run_report(
        Path(args.campaign),
        html=args.html,
        say=print,
        warn=lambda message: print(f"haico: {message}", file=sys.stderr),
        finish=args.finish,
    )


def _run_compare(args: argparse.Namespace) -> int:
    from pytest_haico.cli.compare import run_compare

    return run_compare(
        args.a,
        args.b,
        exit_on_regression=args.exit_on_regression,
        say=print,
        warn=lambda message: print(f"haico: {message}", file=sys.stderr),
        finish=args.finish,
    )


def _exit_now(status: int) -> NoReturn:
    """End the process with `status` once what it printed is out; nothing is freed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _request(args: argparse.Namespace) -> Request:
    from pytest_haico.cli.jobs import Request

    return Request(
        arms=tuple(getattr(args, "arm", ())),
        strata=tuple(getattr(args, "stratum", ())),
        time=args.time,
        tasks=args.tasks,
        limit=getattr(args, "limit", 2),
        margin=args.margin,
        force=tuple(args.force),
        dry_run=args.dry_run,
    )


if __name__ == "__main__":
    sys.exit(main())
