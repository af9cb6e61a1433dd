"""pg_dumps of a run's backend database: periodic ones while the run goes on, a final one
before the stack stops, each written under a temporary name and renamed when complete.

The temporary (partial) file is made with the results mode before pg_dump writes into it,
and removed whenever its dump does not complete; pg_dump dies with the thread that started
it, so a killed pytest leaves no pg_dump writing behind, and the batch job removes what
partial file it left (`remove_partial_dumps`)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pytest_haico.errors import DumpError
from pytest_haico.files import create_file, make_dirs, publish_file
from pytest_haico.procfs import death_signal_preexec
from pytest_haico.redact import Redactor
from pytest_haico.stamps import utc_name

# The stack (psycopg, httpx) loads with the service, not with the batch job's clean-up.
if TYPE_CHECKING:
    from pytest_haico.stack.postgres import PostgresService

_log = logging.getLogger(__name__)

DumpKind = Literal["periodic", "final"]
DUMP_TIMEOUT_S = 600.0
PARTIAL_SUFFIX = ".partial"


def run_dumps_dir(run_dir: Path) -> Path:
    """Where the run in `run_dir` writes its dumps."""
    return run_dir / "dumps"


def remove_partial_dumps(dumps_dir: Path) -> list[Path]:
    """Remove the partial files of dumps that never completed (their run was killed, and
    its pg_dump with it); the paths removed."""
    removed: list[Path] = []
    with contextlib.suppress(OSError):  # no dumps directory: nothing was dumped
        for partial in dumps_dir.glob(f".*.dump{PARTIAL_SUFFIX}"):
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
                removed.append(partial)
    return removed


class DatabaseDumps:
    """The dumps of one run into `runs/<run_id>/dumps/`: `<kind>-<UTC timestamp>.dump`.

    Only this run's files are ever removed (its previous periodic dump, once a newer one
    is complete), so a resumed run never deletes an earlier run's dumps.
    """

    def __init__(
        self,
        postgres: PostgresService,
        dumps_dir: Path,
        *,
        interval_s: float,
        file_mode: int = 0o640,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.postgres = postgres
        self.dumps_dir = dumps_dir
        self.interval_s = interval_s
        self.file_mode = file_mode
        self._clock = clock
        self._lock = threading.Lock()  # one pg_dump at a time: the final one waits
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_periodic: Path | None = None
        self._aborted = threading.Event()
        self._process: subprocess.Popen[str] | None = None  # the pg_dump running now
        self.written: list[Path] = []

    def dump(self, kind: DumpKind) -> Path:
        """Write one complete dump and return its path; raises `DumpError`."""
        with self._lock:
            make_dirs(self.dumps_dir, self.file_mode)
            stamp = utc_name(self._clock())
            final = self._free_name(f"{kind}-{stamp}")
            partial = final.with_name(f".{final.name}{PARTIAL_SUFFIX}")
            command = self.postgres.dump_command(partial)
            if self._aborted.is_set():
                raise DumpError(f"pg_dump ({kind}) not started: the run is ending at once")
            partial.unlink(missing_ok=True)  # this run's own, left by a pytest killed mid-dump
            os.close(create_file(partial, self.file_mode))  # pg_dump keeps its mode
            try:
                self._run(kind, command.argv, command.env)
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
            publish_file(partial, final, mode=self.file_mode)
            self.written.append(final)
            if kind == "periodic":
                if self._last_periodic is not None:
                    self._last_periodic.unlink(missing_ok=True)
                self._last_periodic = final
            return final

    def _run(self, kind: DumpKind, argv: Sequence[str], env: Mapping[str, str]) -> None:
        """Run one pg_dump to its end; `DumpError` unless it completed."""
        try:
            process = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=death_signal_preexec(signal.SIGKILL, os.getpid()),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise DumpError(f"pg_dump ({kind}) did not start: {exc}") from None
        self._process = process
        try:
            _, stderr_text = process.communicate(timeout=DUMP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise DumpError(f"pg_dump ({kind}) did not end within {DUMP_TIMEOUT_S:.0f} s") from None
        finally:
            self._process = None
            if process.poll() is None:  # a timeout, or an interrupt of this thread
                process.kill()
                process.wait()
            if process.stderr is not None:  # communicate() closed it, unless interrupted
                process.stderr.close()
        if self._aborted.is_set():
            raise DumpError(f"pg_dump ({kind}) was stopped: the run is ending at once")
        if process.returncode != 0:
            stderr = Redactor(self.postgres.secrets).redact(stderr_text.strip())
            raise DumpError(f"pg_dump ({kind}) exited {process.returncode}: {stderr}")

    def start_periodic(self) -> None:
        """Dump every `interval_s` seconds in a background thread (nothing when 0)."""
        if self.interval_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="haico-dumps", daemon=True)
        self._thread.start()

    def stop_periodic(self) -> None:
        """Stop the periodic dumps, waiting for one in progress to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def abort(self) -> None:
        """The emergency path (SIGTERM): no more dumps, and the one running is killed.

        Safe from a signal handler: it waits for nothing. The newest complete periodic dump
        is what survives; a killed one leaves only its hidden partial file.
        """
        self._aborted.set()
        self._stop.set()
        process = self._process
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.dump("periodic")
            except DumpError as exc:
                # The run goes on: the previous periodic dump is still there.
                _log.warning("haico: %s", exc)

    def _free_name(self, stem: str) -> Path:
        path = self.dumps_dir / f"{stem}.dump"
        n = 1
        while path.exists():
            n += 1
            path = self.dumps_dir / f"{stem}-{n}.dump"
        return path
