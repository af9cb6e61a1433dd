"""A submission's frozen inputs: experiments/ and cluster.env copied under the campaign's
`submissions/<name>/` with their digest, so that the jobs run that copy and an edit made
after `haico submit` never runs under the submitted name (the jobs gate on the digest)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_haico.config.cluster_env import ClusterEnv, load_cluster_env
from pytest_haico.config.frozen import inputs_digest
from pytest_haico.config.project import config_file_in
from pytest_haico.errors import HaicoError, UntrustedFileError
from pytest_haico.files import make_dirs, ownership_problem, read_owned_file, write_atomic
from pytest_haico.ledger.layout import SUBMISSIONS
from pytest_haico.locks import holding

SUBMISSIONS_DIR = SUBMISSIONS
MANIFEST_FILE = "submission.json"
SCRIPT_FILE = "campaign.sbatch"
# The batch script this package ships (the repository's sbatch/campaign.sbatch links to it):
# submitted unless the project has its own sbatch/campaign.sbatch or --sbatch names one.
PACKAGED_SCRIPT = Path(__file__).parents[1] / "templates" / SCRIPT_FILE
_SKIPPED = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.pyc")


class InputsError(HaicoError):
    """The inputs to submit cannot be found, read or frozen."""


@dataclass(frozen=True)
class Sources:
    """What a submission freezes: the experiments, the site file, the batch script, the
    project's pytest configuration and top-level conftest.py when it has them, and the
    catalogue of served models the submitting shell resolved (its jobs attach there)."""

    experiments: Path
    cluster_env: Path | None
    script: Path
    ini_file: Path | None
    conftest: Path | None
    catalogue: Path | None = None

    @classmethod
    def find(
        cls,
        experiments: Path,
        *,
        cluster_env: Path | None = None,
        script: Path | None = None,
        catalogue: Path | None = None,
    ) -> Sources:
        """The sources of the project whose experiments directory is `experiments`."""
        experiments = experiments.resolve()
        if not (experiments / "arms").is_dir():
            raise InputsError(
                f"{experiments} is no experiments directory (it has no arms/): run haico in "
                "the project that holds experiments/, or pass --experiments DIR"
            )
        project = experiments.parent
        if cluster_env is None and (experiments / "cluster.env").is_file():
            cluster_env = experiments / "cluster.env"
        if cluster_env is not None and not cluster_env.is_file():
            raise InputsError(f"the cluster.env {cluster_env} is no file: pass an existing one")
        if script is None:
            own = project / "sbatch" / SCRIPT_FILE
            script = own if own.is_file() else PACKAGED_SCRIPT
        if not script.is_file():
            raise InputsError(f"the batch script {script} does not exist: pass an existing one")
        ini_file = config_file_in(project)
        conftest = project / "conftest.py"
        return cls(
            experiments=experiments,
            cluster_env=cluster_env.resolve() if cluster_env else None,
            script=script.resolve(),
            ini_file=ini_file,
            conftest=conftest if conftest.is_file() else None,
            catalogue=catalogue,
        )

    def digest(self) -> str:
        return inputs_digest(self.experiments, self.cluster_env)


@dataclass(frozen=True)
class Submission:
    """One frozen copy of the inputs under `<campaign>/submissions/<name>/`, its manifest
    and its journal; `name` is the start of the inputs' digest, so the same inputs always
    make the same submission and an edited one a new one."""

    campaign_dir: Path
    name: str
    manifest: dict[str, Any]

    @property
    def dir(self) -> Path:
        return submissions_dir(self.campaign_dir) / self.name

    @property
    def digest(self) -> str:
        return str(self.manifest["digest"])

    @property
    def campaign(self) -> str:
        return self.campaign_dir.name

    @property
    def results(self) -> Path:
        return self.campaign_dir.parent

    @property
    def profile(self) -> str:
        return str(self.manifest["profile"])

    @property
    def python(self) -> str:
        return str(self.manifest["python"])

    @property
    def experiments(self) -> Path:
        return self.dir / "experiments"

    @property
    def catalogue(self) -> Path | None:
        """Where the jobs find served models: the catalogue the first `haico submit` of these
        inputs resolved (None in a submission frozen before the jobs were given it)."""
        path = self.manifest.get("catalogue")
        return Path(path) if path else None

    @property
    def cluster_env(self) -> Path | None:
        name = self.manifest.get("cluster_env")
        return self.dir / str(name) if name else None

    @property
    def script(self) -> Path:
        return self.dir / SCRIPT_FILE

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def journal(self) -> Path:
        return self.dir / "journal.jsonl"

    @property
    def checklist(self) -> Path:
        return self.dir / "checklist.md"

    def site(self) -> ClusterEnv | None:
        """The submission's cluster.env: its frozen copy, or before the first submit has
        frozen one (a plan, a dry run), the source it will copy."""
        path = self.cluster_env
        if path is not None and not self.dir.is_dir():
            path = Path(self.manifest["sources"]["cluster_env"])
        return load_cluster_env(path) if path is not None else None


def submissions_dir(campaign_dir: Path) -> Path:
    """Where a campaign's submissions are."""
    return campaign_dir / SUBMISSIONS_DIR


def submission_lock(
    campaign_dir: Path, name: str, *, command: str, say: Callable[[str], object]
) -> AbstractContextManager[None]:
    """Hold submission `name`'s lock as `haico <command>`: one writer per submission, from
    the first read of its journal to the last sbatch. The lock is beside the submission's
    directory, which the first `haico submit` makes while holding it."""
    lock = submissions_dir(campaign_dir) / f".{name}.lock"
    return holding(lock, what=f"submission {name}", command=command, say=say)


def submission_name(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


def planned_submission(campaign_dir: Path, sources: Sources, profile: str) -> Submission:
    """The submission these sources make, as it is or would be on disk (nothing written)."""
    digest = sources.digest()
    name = submission_name(digest)
    existing = load_submission(campaign_dir, name)
    if existing is not None:
        if existing.digest != digest:
            raise InputsError(
                f"{existing.dir / MANIFEST_FILE} records digest {existing.digest}, not "
                f"{digest}: the submission directory was altered; move it aside"
            )
        return existing
    cluster_name = None
    if sources.cluster_env is not None:
        inside = sources.cluster_env.is_relative_to(sources.experiments)
        cluster_name = (
            f"experiments/{sources.cluster_env.relative_to(sources.experiments)}"
            if inside
            else "cluster.env"
        )
    manifest = {
        "name": name,
        "digest": digest,
        "campaign": campaign_dir.name,
        "profile": profile,
        "python": sys.executable,
        "cluster_env": cluster_name,
        "catalogue": str(sources.catalogue) if sources.catalogue else None,
        "ini_file": sources.ini_file.name if sources.ini_file else "pytest.ini",
        "sources": {
            "experiments": str(sources.experiments),
            "cluster_env": str(sources.cluster_env) if sources.cluster_env else None,
            "script": str(sources.script),
        },
        "created": None,  # set when it is written
    }
    return Submission(campaign_dir=campaign_dir, name=name, manifest=manifest)


def freeze(submission: Submission, sources: Sources, *, created: str) -> Submission:
    """Write the submission's frozen copy (whole, or not at all) unless it exists; its
    files are made read-only, and their digest is checked against the sources'."""
    if submission.dir.is_dir():
        return submission
    parent = submission.dir.parent
    try:
        make_dirs(parent, 0o640)
        staging = parent / f".{submission.name}.{os.getpid()}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o750)
        try:
            shutil.copytree(sources.experiments, staging / "experiments", ignore=_SKIPPED)
            if sources.cluster_env is not None and not sources.cluster_env.is_relative_to(
                sources.experiments
            ):
                shutil.copyfile(sources.cluster_env, staging / "cluster.env")
            shutil.copyfile(sources.script, staging / SCRIPT_FILE)
            (staging / SCRIPT_FILE).chmod(0o550)
            ini = staging / str(submission.manifest["ini_file"])
            if sources.ini_file is not None:
                shutil.copyfile(sources.ini_file, ini)
            else:
                ini.write_text("[pytest]\n# Written by haico submit: the jobs' rootdir.\n")
            if sources.conftest is not None:
                shutil.copyfile(sources.conftest, staging / "conftest.py")
            manifest = {**submission.manifest, "created": created}
            frozen = Submission(submission.campaign_dir, submission.name, manifest)
            copied = inputs_digest(
                staging / "experiments",
                staging / str(manifest["cluster_env"]) if manifest["cluster_env"] else None,
            )
            if copied != submission.digest:
                raise InputsError(
                    f"the copy of {sources.experiments} has digest {copied}, the sources "
                    f"{submission.digest}: they changed while they were copied; submit again"
                )
            _read_only(staging)
            (staging / "logs").mkdir(mode=0o750)
            write_atomic(
                staging / MANIFEST_FILE, json.dumps(manifest, indent=2).encode() + b"\n", mode=0o440
            )
            staging.rename(submission.dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    except OSError as exc:
        raise InputsError(
            f"cannot write the submission {submission.dir}: {exc.strerror or exc}"
        ) from exc
    return frozen


def _read_only(root: Path) -> None:
    """Files read-only, directories writable by this user alone (copies keep the sources'
    modes, which a umask of 002 makes group-writable)."""
    for path in root.rglob("*"):
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod(mode & ~(0o222 if path.is_file() else 0o022))


def check_trusted(directory: Path) -> None:
    """Every file and directory of a submission is this user's, writable by it alone, and a
    regular file or a directory (not a symlink, FIFO or device), else an `InputsError`
    naming the first that is not: the jobs run what it holds under this user's name. The
    jobs' logs are not looked into (Slurm writes them; nothing reads them as input). Only
    `lstat` is used, so a FIFO is refused without waiting for a writer. An entry gone by
    the time it is looked at is no longer in the tree: another haico command of this
    submission renamed its temporary file into place (its checklist, a share's items)."""
    todo = [directory]
    while todo:
        current = todo.pop()
        try:
            info = os.lstat(current)
            problem = ownership_problem(info)
            if problem is None and not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                problem = "is not a regular file"
            if problem is not None:
                raise InputsError(untrusted(current, problem))
            if stat.S_ISDIR(info.st_mode) and current != directory / "logs":
                todo += sorted(current.iterdir(), reverse=True)
        except FileNotFoundError:
            if current == directory:
                raise InputsError(f"cannot read {current}: it is gone") from None
        except OSError as exc:
            raise InputsError(f"cannot read {current}: {exc.strerror or exc}") from exc


def untrusted(path: Path, problem: str) -> str:
    """The one line that refuses a submission's file another user could have planted."""
    return (
        f"{path} {problem}: haico trusts a submission's files only when they are yours and "
        "writable by you alone; move the submission aside (`haico submit` freezes the inputs "
        "anew and finds its jobs in Slurm by name)"
    )


def load_submission(campaign_dir: Path, name: str) -> Submission | None:
    """The submission `name`, its files checked (`check_trusted`); None when it has none."""
    directory = campaign_dir / SUBMISSIONS_DIR / name
    path = directory / MANIFEST_FILE
    try:
        manifest = json.loads(read_owned_file(path))
    except FileNotFoundError:
        return None
    except UntrustedFileError as exc:
        raise InputsError(untrusted(exc.path, exc.problem)) from exc
    except (OSError, ValueError) as exc:
        raise InputsError(f"cannot read {path}: {exc}; move the submission aside") from exc
    if not isinstance(manifest, dict) or "digest" not in manifest:
        raise InputsError(f"{path} is no submission manifest; move the submission aside")
    check_trusted(directory)
    return Submission(campaign_dir=campaign_dir, name=name, manifest=manifest)


def newest_submission(campaign_dir: Path) -> Submission:
    """The campaign's most recently created submission."""
    root = campaign_dir / SUBMISSIONS_DIR
    found = [
        submission
        for entry in sorted(root.iterdir() if root.is_dir() else [])
        if not entry.name.startswith(".")
        and (submission := load_submission(campaign_dir, entry.name)) is not None
    ]
    if not found:
        raise InputsError(
            f"{campaign_dir} has no submission yet: start with "
            f"`haico submit {campaign_dir} --stage smoke`"
        )
    return max(found, key=lambda s: str(s.manifest.get("created") or ""))


def find_submission(campaign_dir: Path, name: str | None) -> Submission:
    """The submission `name` (12 hex digits) of the campaign, else its newest."""
    if not campaign_dir.is_dir():
        raise InputsError(
            f"{campaign_dir} is no campaign directory: give <results>/<campaign>, or the "
            "campaign's name with --results"
        )
    if not name:
        return newest_submission(campaign_dir)
    if not (len(name) == 12 and all(c in "0123456789abcdef" for c in name)):
        raise InputsError(
            f"--submission {name!r}: a submission is named by 12 hex digits, as under "
            f"{campaign_dir}/{SUBMISSIONS_DIR}/"
        )
    found = load_submission(campaign_dir, name)
    if found is None:
        raise InputsError(f"{campaign_dir} has no submission {name}")
    return found


def submitted_identity(campaign_dir: Path) -> tuple[str, str | None] | None:
    """The profile and site backend image the campaign's newest submission ran its items
    under (what their ids were made with); None when it has no readable submission."""
    try:
        submission = newest_submission(campaign_dir)
    except (InputsError, OSError):
        return None
    site = submission.site()
    return submission.profile, site.get("BACKEND_IMAGE") if site else None
