"""`haico serve <arm> [--name NAME] [--time T [--until D [--renew-lead M]]]`, `haico serve
--list`, `haico serve status NAME` and `haico serve stop NAME`: a model served for others as
a Slurm job (renewed until D when asked), registered in the catalogue
(`$CLUSTER_WORK/catalogue`) that campaigns resolve it in."""

from __future__ import annotations

import argparse

from pytest_haico.cli import arguments
from pytest_haico.config.resolution import resolve_places, resolve_results_mode
from pytest_haico.errors import ConfigError


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve an arm's model as a Slurm job registered in the catalogue",
        usage=(
            "haico serve <arm> [--name NAME] [--time T [--until D [--renew-lead M]]] | --list "
            "| status NAME | stop NAME"
        ),
    )
    serve.add_argument("words", nargs="*", metavar="ARM | status NAME | stop NAME")
    serve.add_argument("--list", action="store_true", help="every served model, and its state")
    serve.add_argument("--name", help="the catalogue name (default: the arm's name)")
    serve.add_argument("--time", help="the job's time limit (default: the arm's [slurm] time)")
    serve.add_argument(
        "--until",
        help="renew the job before its time limit, serving for this long in all (Slurm time)",
    )
    serve.add_argument(
        "--renew-lead",
        help="with --until: queue the successor to start this long before a job's end "
        "(minutes; default 15, or half of --time when less)",
    )
    serve.add_argument(
        "--profile",
        choices=("local", "cluster"),
        default="cluster",
        help="cluster: vLLM from VLLM_VENV (default); local: the stand-in model",
    )
    arguments.add_project_options(serve)
    serve.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pytest_haico.config.settings import Profile
    from pytest_haico.serve import control
    from pytest_haico.serve.submission import ServeRequest, serve

    r = arguments.resolver(args)
    places = resolve_places(r)
    words = list(args.words)
    if args.list:
        if words:
            raise ConfigError("haico serve --list", "", "takes no other argument")
        return control.list_catalogue(places.catalogue, say=print)
    if len(words) == 2 and words[0] in ("status", "stop"):
        action = control.status if words[0] == "status" else control.stop
        return action(places.catalogue, words[1], say=print)
    if len(words) != 1 or words[0] in ("status", "stop"):
        raise ConfigError(
            "haico serve", "", "give an arm to serve, --list, status NAME or stop NAME"
        )
    request = ServeRequest(
        arm=words[0],
        experiments=places.experiments,
        catalogue=places.catalogue,
        profile=Profile(args.profile),
        name=args.name,
        time=args.time,
        until=args.until,
        renew_lead=args.renew_lead,
        cluster_env=places.cluster_env,
        site=places.site,
        file_mode=resolve_results_mode(r),
    )
    return serve(request, say=print)
