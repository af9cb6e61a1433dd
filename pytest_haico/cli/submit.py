"""`haico submit <campaign> --stage smoke|full|continue` and `haico continue <campaign>`:
staged, journaled submission of a campaign's frozen inputs, and its continuation."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_haico.cli import arguments
from pytest_haico.errors import ConfigError
from pytest_haico.submit.decisions import DEFAULT_MAX_ROUNDS
from pytest_haico.submit.until_done import DEFAULT_EVERY_MIN, MAX_BACKOFF, MIN_EVERY_MIN

if TYPE_CHECKING:
    from pytest_haico.submit.jobs import Request


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`haico submit` and `haico continue`."""
    submit = commands.add_parser("submit", help="freeze the inputs and submit one stage")
    submit.add_argument("campaign", help="campaign name (under the results root) or directory")
    submit.add_argument("--stage", required=True, choices=("smoke", "full", "continue"))
    submit.add_argument("--arm", action="append", default=[], help="only this arm (repeatable)")
    submit.add_argument(
        "--stratum", action="append", default=[], help="only this stratum (repeatable)"
    )
    submit.add_argument(
        "--limit",
        type=arguments.positive_int,
        default=2,
        help="smoke: items per arm × stratum in all, dealt over its tasks (default 2)",
    )
    submit.add_argument(
        "--profile", choices=("local", "cluster"), help="default: cluster with a cluster.env"
    )
    submit.add_argument(
        "--sbatch",
        type=Path,
        help="default: <project>/sbatch/campaign.sbatch, else the one pytest-haico ships",
    )
    _add_job_options(submit)
    arguments.add_project_options(submit)
    submit.set_defaults(run=run_submit)

    cont = commands.add_parser(
        "continue", help="resubmit what the newest submission's jobs left unfinished"
    )
    cont.add_argument("campaign", help="campaign name (under the results root) or directory")
    cont.add_argument("--submission", help="this submission instead of the newest")
    cont.add_argument(
        "--include-cancelled",
        action="store_true",
        help="rerun the shares whose jobs were cancelled (scancel) too",
    )
    cont.add_argument(
        "--max-rounds",
        type=arguments.positive_int,
        default=DEFAULT_MAX_ROUNDS,
        help="stop a share after this many attempts in a row that had their chance (their "
        "walltime, or their stack up) and recorded no item "
        f"(default {DEFAULT_MAX_ROUNDS})",
    )
    cont.add_argument(
        "--no-exclude",
        action="store_true",
        help="keep no node out of the reruns: by default a node on which several attempts "
        "failed by the infrastructure, while the same arm's attempts recorded items "
        "elsewhere, is excluded (sbatch --exclude), and stays excluded in later rounds",
    )
    cont.add_argument(
        "--until-done",
        action="store_true",
        help="continue every --every minutes until every share is done (exit 0) or one "
        "needs you (exit 1)",
    )
    cont.add_argument(
        "--every",
        type=arguments.number_between(MIN_EVERY_MIN, 24 * 60, "a number of minutes"),
        default=DEFAULT_EVERY_MIN,
        metavar="MINUTES",
        help=f"--until-done: minutes between rounds, at least {MIN_EVERY_MIN:g}, doubled up to "
        f"{MAX_BACKOFF}x while nothing changes (default {DEFAULT_EVERY_MIN:g})",
    )
    _add_job_options(cont)
    arguments.add_project_options(cont)
    cont.set_defaults(run=run_continue)


def _add_job_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--time", help="walltime per task (Slurm's format), instead of measured")
    parser.add_argument(
        "--tasks", type=arguments.positive_int, help="array tasks, instead of measured"
    )
    parser.add_argument(
        "--margin",
        type=arguments.margin,
        default=1.5,
        help="factor on the measured work (default 1.5)",
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


def run_submit(args: argparse.Namespace) -> int:
    if args.stage == "continue":
        return run_continue(args)
    from pytest_haico.submit.inputs import Sources
    from pytest_haico.submit.stages import submit

    if ".." in Path(args.campaign).parts:
        raise ConfigError(
            "campaign",
            "",
            f"{args.campaign!r} climbs out with '..': a submission writes into the campaign "
            "directory; give the campaign's name, or its directory without '..'",
        )
    places = arguments.places(args)
    campaign = arguments.campaign_dir(args, places)
    sources = Sources.find(
        places.experiments,
        cluster_env=places.cluster_env,
        script=args.sbatch,
        catalogue=places.catalogue,
    )
    profile = args.profile or ("cluster" if sources.cluster_env is not None else "local")
    return submit(
        campaign,
        sources,
        args.stage,
        _request(args),
        profile=profile,
        say=print,
    )


def run_continue(args: argparse.Namespace) -> int:
    from pytest_haico.submit.continuation import continue_
    from pytest_haico.submit.inputs import find_submission

    submission = find_submission(arguments.campaign_dir(args), getattr(args, "submission", None))
    print(f"haico: submission {submission.name} ({submission.digest})", flush=True)
    if getattr(args, "until_done", False):
        from pytest_haico.submit.until_done import until_done

        return until_done(submission, _request(args), every_min=args.every, say=_say)
    return continue_(submission, _request(args), say=print)


def _say(line: str) -> None:
    """A line of a long-running command, out at once (its log may be a file)."""
    print(line, flush=True)


def _request(args: argparse.Namespace) -> Request:
    from pytest_haico.submit.jobs import Request

    return Request(
        arms=tuple(getattr(args, "arm", ())),
        strata=tuple(getattr(args, "stratum", ())),
        time=args.time,
        tasks=args.tasks,
        limit=getattr(args, "limit", 2),
        margin=args.margin,
        force=tuple(args.force),
        dry_run=args.dry_run,
        include_cancelled=getattr(args, "include_cancelled", False),
        max_rounds=getattr(args, "max_rounds", DEFAULT_MAX_ROUNDS),
        exclude_nodes=not getattr(args, "no_exclude", False),
    )
