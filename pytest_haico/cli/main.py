"""`haico`: the campaign's operations on a login node (also `python -m pytest_haico`).

    haico cost <results>/<campaign> [--concurrency N] [--margin 1.5]
    haico submit <campaign> --stage smoke|full [--arm A] [--time T] [--tasks N] [--dry-run]
    haico continue <campaign> [--tasks M] [--include-cancelled] [--until-done] [--dry-run]
    haico report <results>/<campaign> [--html out.html]
    haico compare <A> <B> [--exit-on-regression]  (DIR, DIR@RUN_ID, DIR@latest|previous)
    haico show <test id or item id> [--attempt N] [--campaign NAME]
    haico validate --baseline CMD|COMMIT --candidate CMD|COMMIT [--arm A] [-- PYTEST ARGS]
    haico init <dir>
    haico stack up <arm> | status [ARM|FILE] | down ARM|FILE
    haico env [--venv-only | --images-only] [--arm A] [--dry-run]
    haico gpu-check [--here] [--arm A | --gpus N] [--full] [--min-tflops X] [--dry-run]
    haico serve <arm> [--name NAME] [--time T [--until D]] | --list | status NAME | stop NAME
    haico --version

One module per command parses its arguments and prints; the work is done by the parts
below the command line. Every error is one line on stderr and exit 2; nothing here prints
a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from pytest_haico.cli import (
    compare,
    cost,
    env,
    gpu_check,
    init,
    report,
    serve,
    show,
    stack,
    submit,
    validate,
)
from pytest_haico.cli.output import exit_now
from pytest_haico.errors import HaicoError

USAGE_ERROR = 2


def console() -> NoReturn:
    """The `haico` command (the console script, and `python -m pytest_haico`)."""
    sys.exit(main(hard_exit=True))


def main(argv: Sequence[str] | None = None, *, hard_exit: bool = False) -> int:
    """Run one command; the exit status. `hard_exit` (the command's own process): a report
    or a comparison ends the process once it is printed, without freeing the records it
    read (half a second per 100,000 records; mypy does the same)."""
    args = _parser().parse_args(argv)
    args.finish = exit_now if hard_exit else None
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
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    every = (cost, submit, report, compare, show, validate, init, stack, env, gpu_check, serve)
    for command in every:
        command.add_parser(commands)
    return parser


class _Version(argparse.Action):
    """`haico --version`: the installed pytest-haico's, read only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        import pytest_haico

        print(f"haico (pytest-haico) {pytest_haico.__version__}")
        parser.exit()


if __name__ == "__main__":
    sys.exit(main())
