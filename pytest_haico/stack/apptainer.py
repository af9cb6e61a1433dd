"""Images run by Apptainer: where their SIFs live, and `apptainer exec` with a clean environment.

A service in an image runs as

    apptainer exec --cleanenv --no-home --env-file <file> [--bind <path>]... <sif> <command>

`--cleanenv` because by default Apptainer passes the whole host environment (a user's
`OPENAI_API_KEY`, a registry token) into the container; `--no-home` because it binds
`$HOME` by default; the service's variables, secrets included, come from an env file of
mode 0600 (from its creation) in a private directory under the node-local `$TMPDIR`,
deleted when the service has stopped. The `apptainer` process itself gets a short
allow-list of the host environment, without the `APPTAINERENV_*` variables that would
reach into the container past `--cleanenv`.

SIFs are pulled once per image digest (`haico env`, before the job), never per task:
`<SIF_DIR>/<name>-sha256-<64 hex>.sif`, with `SIF_DIR` from cluster.env (default
`$CLUSTER_WORK/sif`) and `<name>` the image repository's last component.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_haico.config.cluster_site import sif_path
from pytest_haico.errors import StackError
from pytest_haico.stack.profiles import HttpService
from pytest_haico.stack.service import Command, write_env_file
from pytest_haico.stack.statedir import make_owned_tempdir, remove_tree

logger = logging.getLogger(__name__)

# What the `apptainer` process needs of the host: where things are, the locale, and the
# site's Apptainer settings (bind paths, cache). Nothing else, so no secret.
_HOST_KEYS = ("PATH", "TMPDIR", "LANG", "TZ")
_HOST_PREFIXES = ("LC_", "APPTAINER_", "SINGULARITY_")
# Host variables Apptainer hands to the container despite --cleanenv.
_INJECTING_PREFIXES = ("APPTAINERENV_", "SINGULARITYENV_")
ENV_FILE_NAME = "service.env"


def require_sif(image: str, sif_dir: Path, *, what: str, source: str = "cluster.env") -> Path:
    """`sif_path(image, sif_dir)`, which must exist: else a StackError naming the fix."""
    path = sif_path(image, sif_dir, source=source)
    if not path.is_file():
        pull = (
            "pull it once, before the job, with `haico env`"
            if image.startswith("docker://")
            else "fix the path"
        )
        raise StackError(
            f"{what}: the image {image} has no SIF at {path}; {pull}; SIFs live in SIF_DIR "
            "(cluster.env; default $CLUSTER_WORK/sif)"
        )
    return path


def host_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What the `apptainer` process itself gets of `environ` (never the container)."""
    return {
        key: value
        for key, value in environ.items()
        if (key in _HOST_KEYS or key.startswith(_HOST_PREFIXES))
        and not key.startswith(_INJECTING_PREFIXES)
    }


@dataclass(frozen=True)
class Apptainer:
    """`apptainer exec` of one SIF: the argv that runs a command in it, and the environment
    of the `apptainer` process. Also a Postgres `Launcher`."""

    executable: str
    image: Path  # the SIF
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)  # the host's

    def exec_argv(
        self, command: Sequence[str], *, env_file: Path | None, binds: Sequence[str] = ()
    ) -> list[str]:
        """`apptainer exec --cleanenv --no-home [--env-file F] [--bind B]... <sif> <command>`."""
        argv = [self.executable, "exec", "--cleanenv", "--no-home"]
        if env_file is not None:
            argv += ["--env-file", str(env_file)]
        for bind in binds:
            argv += ["--bind", bind]
        return [*argv, str(self.image), *command]

    def wrap(
        self, argv: Sequence[str], *, env_file: Path | None, binds: Sequence[Path]
    ) -> list[str]:
        """`exec_argv` with each of `binds` at the same path inside (Postgres' launcher)."""
        return self.exec_argv(argv, env_file=env_file, binds=[str(path) for path in binds])

    def environment(self) -> dict[str, str]:
        """The `apptainer` process's environment: `host_environment` of the host's."""
        return host_environment(self.environ)


@dataclass(kw_only=True)
class ContainerHttpService(HttpService):
    """An `HttpService` whose `argv(port)` and `env()` run inside an image.

    `reserve` makes a private directory under $TMPDIR (the janitor removes it if we die)
    holding the hosts file bound to /etc/hosts, the service's working directory (0700,
    bound at the same path) if it has one, and, at each spawn, the env file with `env()`
    (and the port variable); `cleanup` deletes it once the process has stopped, after
    `keep(work_dir)` has saved what must outlive it.
    """

    apptainer: Apptainer
    hosts: str = ""  # the container's /etc/hosts ("": the host's, Apptainer's default)
    binds: Callable[[], Sequence[str]] = field(default=tuple)
    work_dir_name: str = ""  # the working directory's name in the private one ("": none)
    keep: Callable[[Path], None] | None = None  # at cleanup, given the working directory
    private_dir: Path | None = None

    def reserve(self) -> None:
        """Make the private directory and the hosts file."""
        if self.private_dir is not None:
            return
        directory = make_owned_tempdir(f"{self.name}-")
        try:
            if self.hosts:
                (directory / "hosts").write_text(self.hosts, encoding="utf-8")
            if self.work_dir_name:
                (directory / self.work_dir_name).mkdir(mode=0o700)
                os.chmod(directory / self.work_dir_name, 0o700)  # whatever the umask
        except BaseException:
            remove_tree(directory)
            raise
        self.private_dir = directory
        self.cleanup_paths = (directory,)

    @property
    def env_file(self) -> Path:
        """Where `command` writes the container's environment."""
        if self.private_dir is None:
            raise StackError(f"{self.name} is not reserved yet: start the stack first")
        return self.private_dir / ENV_FILE_NAME

    @property
    def work_dir(self) -> Path | None:
        """The service's working directory, if it has one (known once reserved)."""
        if self.private_dir is None or not self.work_dir_name:
            return None
        return self.private_dir / self.work_dir_name

    @property
    def hosts_file(self) -> Path | None:
        """The file bound to /etc/hosts, if any."""
        return self.private_dir / "hosts" if self.private_dir and self.hosts else None

    def container_env(self, port: int) -> dict[str, str]:
        """Exactly what the service sees besides the image's own variables."""
        env = dict(self.env())
        if self.port_env is not None:
            env[self.port_env] = str(port)
        return env

    def command(self, port: int) -> Command:
        """A fresh env file (a respawn may have new values), then `apptainer exec`."""
        self.reserve()
        self.port = port
        env_file = self.env_file
        env_file.unlink(missing_ok=True)
        write_env_file(env_file, self.container_env(port))
        binds = list(self.binds())
        if self.work_dir is not None:
            binds.append(str(self.work_dir))
        if self.hosts_file is not None:
            binds.append(f"{self.hosts_file}:/etc/hosts:ro")
        argv = self.apptainer.exec_argv(self.argv(port), env_file=env_file, binds=binds)
        return Command(argv=argv, env=self.apptainer.environment(), cwd=self.cwd)

    def cleanup(self) -> None:
        """`keep` the working directory's results, then delete the env file and the private
        directory (the process has stopped). A failed `keep` is logged: the directory
        goes all the same (it is node-local, and nobody else would remove it)."""
        if self.private_dir is not None:
            if self.keep is not None and self.work_dir is not None:
                try:
                    self.keep(self.work_dir)
                except Exception as exc:
                    logger.error("%s: could not save from %s: %s", self.name, self.work_dir, exc)
            if not remove_tree(self.private_dir):
                raise StackError(f"{self.name}: could not remove {self.private_dir}")
            self.private_dir = None
