"""An arm's preflight before its stack starts: its static gates, and gates.json with every
gate run so far. Cheap to import: a failed static gate costs no import of the stack, the
driver or httpx (the dynamic gates are in `stack_gates`)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_haico.config.experiment import Arm
from pytest_haico.config.frozen import INPUTS_DIGEST_ENV
from pytest_haico.config.settings import Profile, Settings
from pytest_haico.errors import ConfigError
from pytest_haico.files import start_write_error
from pytest_haico.gates import filesystem, gpu, static
from pytest_haico.gates.dynamic import JUDGE, SERVED_MODEL
from pytest_haico.gates.result import (
    Gate,
    GateFailedError,
    GateResult,
    failed,
    failure_line,
    first_failure,
    run_gates,
    write_gates_json,
)
from pytest_haico.ledger.item_times import ItemTimes
from pytest_haico.ledger.layout import ArmPaths
from pytest_haico.redact import Redactor
from pytest_haico.runner.served import ServedCheck, served_name
from pytest_haico.runner.walltime import WalltimeAdmission
from pytest_haico.slurm.hostlist import this_host_names
from pytest_haico.stack.request import ModelEndpoint

if TYPE_CHECKING:
    from pytest_haico.config.items import ItemSpec
    from pytest_haico.ledger.recorder import Recorder

_log = logging.getLogger(__name__)

# The model endpoint the local profile (and the relay to a model elsewhere) gives the
# backend, as gate prohibited_environment sees it before the stack starts (no port yet).
LOCAL_MODEL_ENDPOINT = "http://vllm.localhost/v1"
# The free space gate results_writable asks for at the least: the dumps of a new database.
MIN_DUMP_SPACE = 64 * 1024 * 1024
# What the final pg_dump may take on top of --haico-drain-timeout, for walltime admission.
DUMP_MARGIN_S = 30.0
# Dumps of a run that may exist at once: the newest periodic one, the one replacing it,
# the final one.
DUMPS_AT_ONCE = 3

# The static gates of an arm, given its walltime admission (it knows the job's end and
# the item times of earlier runs).
StaticGates = Callable[[WalltimeAdmission], Sequence[Gate]]


class GateLog:
    """Every gate an arm ran, in order, rewritten to gates.json after each batch."""

    def __init__(self, path: Path, *, file_mode: int) -> None:
        self.path = path
        self.file_mode = file_mode
        self.results: tuple[GateResult, ...] = ()
        self.write_failure: OSError | None = None  # the newest write of gates.json, if it failed
        # When the static gates began and ended (epoch seconds), for the run's timeline.
        self.static_span: tuple[float, float] | None = None

    def check(self, results: Sequence[GateResult], *, redactor: Redactor) -> None:
        """Keep `results`, rewrite gates.json, raise `GateFailedError` at a failure."""
        self.results = (*self.results, *results)
        try:
            write_gates_json(self.path, self.results, file_mode=self.file_mode, redactor=redactor)
        except OSError as exc:
            # Never over the gate's own line: a results directory that takes no writes
            # is what gate results_writable reports.
            _log.warning("haico: %s not written: %s", self.path, exc)
            self.write_failure = exc
        else:
            self.write_failure = None
        failure = first_failure(results)
        if failure is not None:
            raise GateFailedError(failure_line(failure), results=self.results)

    def check_written(self) -> None:
        """The gates passed: a gates.json that could not be written (a full disk) ends the
        stack's start with the one line of a start-up write (exit 78)."""
        if self.write_failure is not None:
            raise start_write_error(
                "write the gates' results", self.path, self.write_failure, owner="run directory"
            )


class ArmPreflights:
    """Each arm's static gates, run once before its stack starts; a passed preflight (its
    walltime admission and gate log) is kept for the arm's start."""

    def __init__(
        self,
        settings: Settings,
        arms: Mapping[str, Arm],
        recorder: Recorder,
        *,
        judge_gates: Mapping[str, Callable[[], GateResult]] | None = None,
    ) -> None:
        self.settings = settings
        self.arms = arms
        self.recorder = recorder
        self.judge_gates = dict(judge_gates or {})  # arm -> gate judge of its judge
        # Arm -> every gate its start ran, and gates.json (kept when a static gate failed).
        self.gate_logs: dict[str, GateLog] = {}
        self._passed: dict[str, tuple[WalltimeAdmission, GateLog]] = {}
        # Arm -> its served model, resolved by gate served_model ([model] served).
        self.served: dict[str, ServedCheck] = {}

    def run(self, arm: str, specs: Sequence[ItemSpec]) -> tuple[WalltimeAdmission, GateLog]:
        """The arm's static gates over `specs` (the items it runs); raises `GateFailedError`
        at the first failure."""
        passed = self._passed.get(arm)
        if passed is not None:
            return passed
        began = time.time()
        admission = WalltimeAdmission(
            self.recorder.job.job_id,
            self.recorder.paths(arm).ledger_dir,
            drain_margin_s=self.settings.drain_timeout + DUMP_MARGIN_S,
        )
        gate_log = GateLog(
            self.recorder.claim(arm).path / "gates.json", file_mode=self.recorder.file_mode
        )
        self.gate_logs[arm] = gate_log
        results = run_gates(self._gates(arm, admission, specs))
        gate_log.static_span = (began, time.time())
        # No secret of the run exists before its stack does.
        gate_log.check(results, redactor=Redactor())
        self._passed[arm] = (admission, gate_log)
        return admission, gate_log

    def _gates(
        self, arm: str, admission: WalltimeAdmission, specs: Sequence[ItemSpec]
    ) -> list[Gate]:
        strata = sorted({spec.stratum for spec in specs})
        share = f"run {self.recorder.claim(arm).run_id} of arm {arm}, {self.recorder.share}"
        if strata:
            share += f", {'strata' if len(strata) > 1 else 'stratum'} {', '.join(strata)}"
        name = served_name(self.settings, self.arms[arm])
        if name is not None:
            here = this_host_names(os.environ)
            self.served[arm] = ServedCheck(self.settings, self.arms[arm], name, here=here)
        return static_gates(
            self.settings,
            self.arms[arm],
            admission,
            paths=self.recorder.paths(arm),
            scripts=[spec.source.path for spec in specs],
            strata=strata,
            share=share,
            run_dir=self.recorder.claim(arm).path,
            served=self.served.get(arm),
            judge=self.judge_gates.get(arm),
            share_taken=partial(self.recorder.share_taken, arm),
        )


def static_gates(
    settings: Settings,
    arm: Arm,
    admission: WalltimeAdmission,
    *,
    paths: ArmPaths,
    scripts: Iterable[Path],
    strata: Iterable[str],
    share: str,
    run_dir: Path | None = None,
    served: ServedCheck | None = None,
    judge: Callable[[], GateResult] | None = None,
    share_taken: Callable[[], tuple[str, Path] | None] = lambda: None,
    environ: Mapping[str, str] = os.environ,
) -> list[Gate]:
    """The static gates of `arm`, in DESIGN's order (gate 1, the configuration, ran at
    configure time), each with every input bound. `scripts` and `strata` are those of the
    arm's items in this run; `share` names what this run claimed, and `share_taken()` the
    run that holds one of those shares now, if another does (gate output_collision);
    `run_dir` its directory, where the GPU check an arm asks for logs; `served`, the arm's
    served model, adds gate served_model; `judge`, the gate of the judge its scripts ask."""
    site = settings.site
    cluster = settings.profile is Profile.CLUSTER
    starts_vllm = (
        cluster and settings.model_endpoint is None and settings.attach is None and served is None
    )
    venv_setting = (site.get("VLLM_VENV") if site else None) or environ.get("VLLM_VENV")
    venv = Path(venv_setting) if venv_setting else None
    hf_home = site.get("HF_HOME") if site else None
    strata = sorted(strata)

    def walltime() -> GateResult:
        slowest, stratum = slowest_item(admission.item_times, strata)
        return static.check_walltime(
            admission.remaining_s(),
            slowest,
            drain_margin_s=admission.drain_margin_s,
            stratum=stratum,
        )

    def output_collision() -> GateResult:
        taken = share_taken()
        if taken is None:
            return static.check_output_collision(claimed=True, share=share)
        holder, claim = taken
        return static.check_output_collision(
            claimed=False, share=share, holder=holder, claim_path=claim
        )

    def results_writable() -> GateResult:
        return filesystem.check_results_writable(
            paths.root, bytes_needed=dump_space_needed(paths), file_mode=settings.results_mode
        )

    def inputs_present() -> GateResult:
        # A job of `haico submit` runs the inputs it froze, or nothing: checked first, since
        # an edit can also be what makes an input missing.
        expected = environ.get(INPUTS_DIGEST_ENV)
        frozen = None
        if expected is not None:
            frozen = filesystem.check_frozen_inputs(
                settings.experiments, settings.cluster_env, expected=expected
            )
            if not frozen.passed:
                return frozen
        images = cluster_images(settings, arm, environ) if cluster else []
        if isinstance(images, GateResult):
            return images
        present = filesystem.check_inputs_present(
            arm,
            needs_weights=starts_vllm,
            hf_cache=filesystem.resolve_hf_cache(environ, hf_home),
            scripts=sorted(set(scripts)),
            images=images,
        )
        if frozen is None or not present.passed:
            return present
        return replace(present, detail=f"{present.detail}; {frozen.detail}")

    endpoint = settings.model_endpoint or LOCAL_MODEL_ENDPOINT
    if ModelEndpoint(endpoint).relayed:  # the backend is given the stack's relay instead
        endpoint = LOCAL_MODEL_ENDPOINT
    vllm_environment = partial(
        static.check_vllm_environment,
        environ,
        vllm_venv=venv,
        needs_vllm=starts_vllm,
        needs_apptainer=cluster,
    )
    parallel_width = partial(
        static.check_parallel_width, arm, environ, cluster=cluster, starts_vllm=starts_vllm
    )
    tool_flags = partial(
        static.check_tool_calling_flags, arm, vllm_venv=venv if starts_vllm else None
    )
    gates = [
        Gate(
            static.PROHIBITED_ENVIRONMENT,
            partial(static.check_prohibited_environment, environ, endpoint),
        ),
        Gate(static.LOGIN_NODE, partial(static.check_login_node, environ, cluster=cluster)),
        Gate(static.TOOL_CALLING_FLAGS, tool_flags),
        Gate(static.PARALLEL_WIDTH, parallel_width),
        Gate(static.ONE_NODE, partial(static.check_one_node, environ, cluster=cluster)),
        Gate(static.VLLM_ENVIRONMENT, vllm_environment),
        Gate(filesystem.INPUTS_PRESENT, inputs_present),
        Gate(filesystem.RESULTS_WRITABLE, results_writable),
        Gate(filesystem.NODE_TMPDIR, partial(filesystem.check_node_tmpdir, environ)),
        Gate(static.WALLTIME, walltime),
        # A share another live run held at collection was refused then (a usage error);
        # this one may have been taken since, by a requeue of this run's own job elsewhere.
        Gate(static.OUTPUT_COLLISION, output_collision),
    ]
    if served is not None:
        gates.insert(1, Gate(SERVED_MODEL, served.gate))
    if judge is not None:
        gates.insert(2 if served is not None else 1, Gate(JUDGE, judge))
    if starts_vllm and arm.run.gpu_check and run_dir is not None:
        gates.append(Gate(gpu.GPU_CHECK, partial(_gpu_gate, settings, arm, environ, venv, run_dir)))
    return gates


def _gpu_gate(
    settings: Settings, arm: Arm, environ: Mapping[str, str], venv: Path | None, run_dir: Path
) -> GateResult:
    """Gate gpu_check with the site's floor (GPU_MIN_TFLOPS), logging in the run's logs/."""
    from pytest_haico.config.cluster_site import resolve_cluster_site

    try:
        floor = resolve_cluster_site(settings.site, environ).gpu_min_tflops
    except ConfigError as exc:
        return failed(gpu.GPU_CHECK, str(exc), "fix GPU_MIN_TFLOPS in cluster.env")
    return gpu.check_gpus(
        environ,
        venv=venv,
        expected=arm.vllm.tensor_parallel_size * arm.vllm.data_parallel_size,
        settings=replace(gpu.GATE_BURN, min_tflops=floor),
        log_dir=run_dir / "logs",
    )


def cluster_images(
    settings: Settings, arm: Arm, environ: Mapping[str, str]
) -> list[Path] | GateResult:
    """The SIFs the cluster profile runs for `arm` (Postgres', and the backend's unless
    --haico-backend-cmd replaces it), or gate inputs_present failed when an image is not
    set or not pinned by digest."""
    # Imported here: the stack's modules cost a failed earlier gate nothing.
    from pytest_haico.config.cluster_site import image_sifs, resolve_cluster_site

    try:
        sifs = image_sifs(
            resolve_cluster_site(settings.site, environ),
            arm,
            backend_image=settings.backend_image,
            backend_command=settings.backend_cmd is not None,
        )
    except ConfigError as exc:
        return failed(
            filesystem.INPUTS_PRESENT,
            f"cannot locate the images to run: {exc}",
            "set POSTGRES_IMAGE and BACKEND_IMAGE (and PHOENIX_IMAGE with PHOENIX_ENABLED=1) "
            "in cluster.env (or [backend] image in "
            f"arms/{arm.name}.toml, or --haico-backend-image) to docker://<repo>@sha256:<64 "
            "hex> or the absolute path of a .sif, and SIF_DIR or CLUSTER_WORK for the pulled "
            "SIFs",
        )
    return list(sifs.values())


def slowest_item(times: ItemTimes, strata: Iterable[str]) -> tuple[float | None, str]:
    """What gate walltime checks: the longest measured item of the stratum whose longest is
    shortest (a run that can finish one item is worth starting), and that stratum; else
    None and the strata's names."""
    strata = sorted(strata)
    measured = [
        (item.longest_s, stratum) for stratum in strata if (item := times.get(stratum)) is not None
    ]
    if not measured:
        return None, ", ".join(strata) or "default"
    return min(measured)


def dump_space_needed(paths: ArmPaths) -> int:
    """The free space the arm's pg_dumps may need: `DUMPS_AT_ONCE` dumps as large as the
    largest of its earlier runs, at least `MIN_DUMP_SPACE`."""
    largest = 0
    with contextlib.suppress(OSError):
        for dump in paths.runs_dir.glob("*/dumps/*.dump"):
            with contextlib.suppress(OSError):
                largest = max(largest, dump.stat().st_size)
    return max(MIN_DUMP_SPACE, DUMPS_AT_ONCE * largest)
