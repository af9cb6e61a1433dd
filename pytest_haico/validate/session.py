"""One `haico validate`: the selected items of one arm run twice on one model — with the
baseline build, then with the candidate — each run a `python -m pytest` of its own in a new
campaign (`validate-<UTC stamp>` unless named), so the two runs' records never mix and the
candidate's items are never taken as done (the backend build is part of an item's
identity); then `haico compare` of the two runs.

The model is a kept stack's (`--attach ARM|FILE`, `haico stack up`), else one this command
starts for both runs as a kept stack of the arm and stops at the end; both runs reach it
through `--haico-model-endpoint` (its key in the environment, never in argv), so both
record the same model identity.

Exit, with `--max-drop SHARE`: 1 when the candidate's pass rate is lower than the baseline's
by more than SHARE at `--confidence` (the interval gate of `haico compare --max-drop`), else
0. Without it, the strict per-item rule: 1 when any item completed with the baseline and not
with the candidate (`haico compare --exit-on-regression`), else 0.
Either way: 75 when a run did not finish (interrupted, infrastructure, a failed gate); a
usage error is a `ValidateError` (exit 2 from the command line).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from pytest_haico.config.experiment import load_arm
from pytest_haico.config.identity import model_identity
from pytest_haico.config.project import find_project_config
from pytest_haico.config.resolution import (
    Places,
    Resolver,
    resolve_places,
    resolve_results_mode,
)
from pytest_haico.config.settings import Profile
from pytest_haico.config.values import MODEL_API_KEY_ENV, enum_parser, parse_command, parse_name
from pytest_haico.files import dir_mode, make_dirs, shown_path
from pytest_haico.ledger.layout import ArmPaths, run_id_of_ledger
from pytest_haico.report.compare import print_comparison
from pytest_haico.report.paired import Gate
from pytest_haico.results import paused_gc
from pytest_haico.results.stats import CONFIDENCE
from pytest_haico.stack.kept import KeptState, read_state, state_path
from pytest_haico.stamps import utc_name
from pytest_haico.validate.builds import (
    Build,
    ValidateError,
    checked_out,
    refuse_the_same_build,
    resolve_build,
)

Say = Callable[[str], None]
NOT_FINISHED = 75
# pytest's options `haico validate` sets itself, and its own option that stands for each.
OWNED = {
    "--haico-backend-cmd": "--baseline and --candidate",
    "--haico-backend-image": "--baseline and --candidate",
    "--haico-campaign": "--campaign",
    "--haico-results": "--results",
    "--haico-experiments": "--experiments",
    "--haico-cluster-env": "--cluster-env",
    "--haico-profile": "--profile",
    "--haico-arm": "--arm",
    "--haico-attach": "--attach",
    "--haico-model-endpoint": "--attach",
    "--haico-model": "--attach",
    "--haico-exit": "nothing (the runs use --haico-exit campaign)",
    "--haico-no-resume": "nothing (each validation is a new campaign)",
}
_WHY = {NOT_FINISHED: "interrupted, or infrastructure failures owe a retry", 78: "a gate failed"}


@dataclass(frozen=True)
class Request:
    """What `haico validate` was asked; `resolver` gives the project's settings (flags, then
    the environment and the pytest configuration, as for pytest)."""

    baseline: str
    candidate: str
    backend_repo: Path
    arm: str | None
    campaign: str | None
    attach: str | None
    pytest_args: tuple[str, ...]
    resolver: Resolver
    # `--max-drop` and `--confidence`: the interval gate instead of the strict per-item rule.
    gate: Gate | None = None
    pass_rule: str | None = None
    confidence: float = CONFIDENCE


@dataclass(frozen=True)
class _Model:
    state: KeptState
    started: bool  # this validation started the kept stack (and stops it)


class _Terminated(KeyboardInterrupt):
    """SIGTERM reached `haico validate` (a KeyboardInterrupt, so that what stops on Ctrl-C
    stops on it too); `run` is the run it stopped, `records` where that run's are."""

    def __init__(self) -> None:
        super().__init__("SIGTERM")
        self.run: str | None = None
        self.records: Path | None = None


def validate(request: Request, *, say: Say) -> int:
    """Run both builds on one model and print the comparison; the exit status."""
    try:
        with _terminate_as_exception():
            return _validate(request, say)
    except _Terminated as stopped:
        during = f" during the {stopped.run} run" if stopped.run else ""
        records = f"its records: {stopped.records}; " if stopped.records else ""
        say(
            f"haico: validate: stopped by SIGTERM{during} (exit {NOT_FINISHED}): nothing "
            f"compared; {records}rerun the same command for a new validation (another "
            "--campaign if it names one)"
        )
        return NOT_FINISHED
    except KeyboardInterrupt:
        say("haico: validate: interrupted; nothing compared")
        return NOT_FINISHED


def _validate(request: Request, say: Say) -> int:
    refuse_owned_options(request.pytest_args)
    r = request.resolver
    places = resolve_places(r)
    profile = r.get("profile", enum_parser(Profile), Profile.LOCAL)
    template = r.get("backend_cmd", parse_command, None)
    arm = _arm_name(request.arm, places.experiments)
    repo = request.backend_repo.resolve()
    builds = [
        resolve_build(role, given, repo=repo, template=template)
        for role, given in (("baseline", request.baseline), ("candidate", request.candidate))
    ]
    refuse_the_same_build(*builds)
    name = request.campaign or f"validate-{utc_name()}"
    campaign_dir = places.results / parse_name(name, "--campaign")
    with contextlib.ExitStack() as stack:
        stack.enter_context(_new_campaign(campaign_dir, resolve_results_mode(r)))
        say(f"haico: validate: arm {arm}, campaign {shown_path(campaign_dir)}")
        model = stack.enter_context(
            _model(request.attach, arm, profile, places, r, campaign_dir, say)
        )
        endpoint = model.state.model_endpoint
        identity = model_identity(
            load_arm(places.experiments / "arms" / f"{arm}.toml"),
            profile=profile,
            endpoint=endpoint,
        )
        started = "started for both runs" if model.started else "kept up by `haico stack up`"
        say(
            f"haico: validate: one model for both runs: {endpoint}, the kept stack of arm "
            f"{model.state.arm} ({started}); model identity {identity}"
        )
        env = {**os.environ, MODEL_API_KEY_ENV: model.state.api_key}
        argv = [*_pytest_options(places, profile, name, arm, endpoint), *request.pytest_args]
        arm_paths = ArmPaths(campaign_dir / arm)
        runs: list[str] = []
        for build in builds:
            before = _ledger_runs(arm_paths)
            try:
                status = _run(build, argv, env, say)
            except _Terminated as stopped:
                stopped.run, stopped.records = build.role, campaign_dir / arm
                raise
            if status != 0:
                return _not_finished(build, status, campaign_dir / arm, say)
            new = sorted(_ledger_runs(arm_paths) - before)  # one pytest process: one run id
            if not new:
                raise ValidateError(
                    f"the {build.role} run recorded no item: pytest's arguments "
                    f"{' '.join(request.pytest_args) or '(none)'} select no item of arm {arm}"
                )
            runs.append(new[0])
    say(f"haico: validate: A = baseline, {builds[0].describe()}: run {runs[0]}")
    say(f"haico: validate: B = candidate, {builds[1].describe()}: run {runs[1]}")
    with paused_gc():
        printed = print_comparison(
            f"{campaign_dir / arm}@{runs[0]}",
            f"{campaign_dir / arm}@{runs[1]}",
            say=say,
            warn=say,
            gate=request.gate,
            pass_rule=request.pass_rule,
            confidence=request.confidence,
        )
    regressions = printed.regressions
    if printed.decision is not None:
        verdict = "exit 1" if printed.decision.failed else "exit 0"
        say(f"haico: validate: {printed.decision.line}: {verdict}")
        return 1 if printed.decision.failed else 0
    if regressions:
        say(f"haico: validate: {regressions} regression(s) in the candidate: exit 1")
        return 1
    say("haico: validate: no regression in the candidate: exit 0")
    return 0


def _pytest_options(
    places: Places, profile: Profile, campaign: str, arm: str, endpoint: str
) -> list[str]:
    """What both runs are given, whatever directory they run in: the project's
    configuration and places, this validation's campaign and arm, and the one model."""
    project = find_project_config(Path.cwd())
    return [
        str(places.experiments),
        f"--rootdir={project.rootdir}",
        *([f"--config-file={project.path}"] if project.path is not None else []),
        f"--haico-results={places.results}",
        f"--haico-experiments={places.experiments}",
        *([f"--haico-cluster-env={places.cluster_env}"] if places.cluster_env else []),
        f"--haico-profile={profile.value}",
        f"--haico-campaign={campaign}",
        f"--haico-arm={arm}",
        "--haico-exit=campaign",
        f"--haico-model-endpoint={endpoint}",
    ]


def refuse_owned_options(args: tuple[str, ...]) -> None:
    """pytest's options `haico validate` sets itself are refused after `--`."""
    for arg in args:
        flag = arg.partition("=")[0]
        if flag in OWNED:
            raise ValidateError(
                f"{flag} after --: haico validate sets it for both runs; give {OWNED[flag]}"
            )


def _arm_name(given: str | None, experiments: Path) -> str:
    arms = sorted(p.stem for p in (experiments / "arms").glob("*.toml"))
    if given is not None and given in arms:
        return given
    if given is None and len(arms) == 1:
        return arms[0]
    what = f"no arm {given!r}" if given is not None else f"{len(arms)} arms"
    raise ValidateError(
        f"{experiments / 'arms'} has {what} ({', '.join(arms) or 'none'}): give --arm NAME, "
        "the arm whose items both builds run"
    )


@contextlib.contextmanager
def _new_campaign(campaign_dir: Path, file_mode: int) -> Iterator[None]:
    """Make the campaign's directory, which no other validation may have made (two started
    in the same second have the same default name); removed again if it is still empty
    when the validation stops early."""
    make_dirs(campaign_dir.parent, file_mode)
    try:
        campaign_dir.mkdir(dir_mode(file_mode))
    except FileExistsError:
        raise ValidateError(
            f"{campaign_dir} exists: each validation writes a new campaign, so the records of "
            "two validations never mix; give another --campaign"
        ) from None
    os.chmod(campaign_dir, dir_mode(file_mode))  # mkdir's mode went through the umask
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            campaign_dir.rmdir()  # only while empty: no record is ever removed
        raise


@contextlib.contextmanager
def _model(
    attach: str | None,
    arm: str,
    profile: Profile,
    places: Places,
    r: Resolver,
    campaign_dir: Path,
    say: Say,
) -> Iterator[_Model]:
    """The kept stack whose model both runs use: the one `attach` names, else one started
    now for the arm and stopped on the way out."""
    from pytest_haico.kept.control import down, up

    if attach is not None:
        path = Path(attach) if os.sep in attach or attach.endswith(".json") else state_path(attach)
        state = read_state(path)
        if state.arm != arm:
            raise ValidateError(
                f"{path} keeps arm {state.arm}, not arm {arm}: give --arm {state.arm}, or attach "
                f"to a stack of arm {arm}"
            )
        if state.profile != profile.value:
            raise ValidateError(
                f"{path} keeps the {state.profile} profile's stack, not the {profile.value} "
                f"profile's: give --profile {state.profile}"
            )
        yield _Model(state, started=False)
        return
    up(
        arm,
        experiments=places.experiments,
        profile=profile,
        cluster_env=places.cluster_env,
        campaign_dir=campaign_dir,
        backend_command=None,
        backend_image=None,
        dump_interval_s=0.0,
        file_mode=resolve_results_mode(r),
        say=lambda line: None if line.startswith("haico: next:") else say(line),
    )
    path = state_path(arm)
    try:
        yield _Model(read_state(path), started=True)
    finally:
        down(str(path), say=say)


def _run(build: Build, argv: list[str], env: dict[str, str], say: Say) -> int:
    """pytest with this build's backend command, in its directory; its exit status."""
    with checked_out(build) as where:
        checkout = f", checked out in {shown_path(where)}" if build.commit else ""
        say(f"haico: validate: the {build.role} run: {build.describe()}{checkout}")
        sys.stdout.flush()
        command = [
            sys.executable,
            "-P",
            "-m",
            "pytest",
            *argv,
            f"--haico-backend-cmd={build.command}",
        ]
        process = subprocess.Popen(command, cwd=where, env=env)
        try:
            return process.wait()
        except _Terminated:
            # The run records what is in flight and stops its stack (its exit 75); then the
            # worktree and the model's stack go.
            process.send_signal(signal.SIGTERM)
            process.wait()
            raise
        except KeyboardInterrupt:  # the run had the same Ctrl-C: it records what was in flight
            process.wait()
            return NOT_FINISHED


def _not_finished(build: Build, status: int, arm_dir: Path, say: Say) -> int:
    if status == 4:
        raise ValidateError(f"the {build.role} run refused its options (pytest's exit 4, above)")
    why = _WHY.get(status, "pytest ended abnormally")
    say(
        f"haico: validate: the {build.role} run did not finish (pytest exit {status}: {why}); "
        f"nothing compared; its records: {arm_dir}"
    )
    return NOT_FINISHED


def _ledger_runs(arm: ArmPaths) -> set[str]:
    """The runs with a ledger in the arm's ledger directory (none while it is missing)."""
    try:
        names = arm.ledger_names()
    except FileNotFoundError:
        return set()
    return {run_id_of_ledger(Path(name)) for name in names}


@contextlib.contextmanager
def _terminate_as_exception() -> Iterator[None]:
    """The first SIGTERM raises `_Terminated`, so the run is stopped and the worktree and
    the stack go away; the next ones (Slurm's, a second `kill`) never cut that short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, _stopping)
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stopping(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM while `haico validate` stops already: it is stopping."""
