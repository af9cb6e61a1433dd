"""Static gates over the environment, the arm and numbers measured earlier: seconds, before
anything starts (DESIGN "Gates" 2-7, 10, 11; the file-system gates 8-9 are in `filesystem`)."""

from __future__ import annotations

import re
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from pytest_haico.config.experiment import Arm
from pytest_haico.durations import format_duration
from pytest_haico.gates.result import GateResult, failed, passed
from pytest_haico.gates.vllm_venv import find_vllm, tool_parser_names
from pytest_haico.redact import Redactor
from pytest_haico.slurm.hostlist import node_names, this_host_names

PROHIBITED_ENVIRONMENT = "prohibited_environment"
LOGIN_NODE = "login_node"
TOOL_CALLING_FLAGS = "tool_calling_flags"
PARALLEL_WIDTH = "parallel_width"
ONE_NODE = "one_node"
VLLM_ENVIRONMENT = "vllm_environment"
WALLTIME = "walltime"
OUTPUT_COLLISION = "output_collision"

_GPU_ENTRY = re.compile(r"^(\d+|GPU-[0-9A-Fa-f-]+|MIG-[0-9A-Za-z/-]+)$")
_LOCAL = "local profile"


def _arm_file(arm: Arm) -> str:
    return f"arms/{arm.name}.toml"


def check_prohibited_environment(environ: Mapping[str, str], model_endpoint: str) -> GateResult:
    """Gate 2: ``OPENAI_ENDPOINT_URL`` is unset, and the model endpoint's host contains ``vllm``.

    `model_endpoint` is the URL the backend is given (the port may be left out before the
    stack starts: ``http://vllm.localhost/v1``).
    """
    if "OPENAI_ENDPOINT_URL" in environ:
        shown = Redactor().redact(environ["OPENAI_ENDPOINT_URL"])[:200]
        return failed(
            PROHIBITED_ENVIRONMENT,
            f"OPENAI_ENDPOINT_URL is set ({shown!r}): the backend would send the "
            "conversations to that endpoint instead of the arm's vLLM",
            "unset it (`unset OPENAI_ENDPOINT_URL`, and remove it from the job script, "
            "~/.bashrc or the module that sets it), then rerun",
        )
    host = urlsplit(model_endpoint).hostname or ""
    if "vllm" not in host:
        return failed(
            PROHIBITED_ENVIRONMENT,
            f"the model endpoint {model_endpoint!r} has host {host!r}, which does not contain "
            "'vllm': the backend would use a real provider's key instead of VLLM_API_KEY",
            "give an endpoint whose host name contains 'vllm' (--haico-model-endpoint "
            "http://vllm-<node>:<port>/v1, or a hosts entry mapping such a name to the server)",
        )
    return passed(
        PROHIBITED_ENVIRONMENT, f"OPENAI_ENDPOINT_URL unset; model endpoint host {host!r}"
    )


def check_login_node(
    environ: Mapping[str, str], *, cluster: bool, hostname: str | None = None
) -> GateResult:
    """Gate 3 (cluster profile): this host is one of the job's nodes (``SLURM_JOB_NODELIST``).

    An ``salloc`` shell runs on the login node with ``SLURM_JOB_ID`` set: that is the case
    this gate exists for.
    """
    if not cluster:
        return passed(LOGIN_NODE, f"{_LOCAL}: no Slurm node check")
    run_on_node = (
        "run pytest on the allocated node: `sbatch sbatch/campaign.sbatch`, or inside the "
        "salloc shell `srun --pty --overlap bash` first (or `srun pytest ...`)"
    )
    job = environ.get("SLURM_JOB_ID")
    if not job:
        return failed(
            LOGIN_NODE,
            "not inside a Slurm job (SLURM_JOB_ID is unset): the cluster profile starts vLLM "
            "on this host, which would be a login node",
            f"{run_on_node}; or use --haico-profile local",
        )
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        return failed(
            LOGIN_NODE,
            f"Slurm job {job} without SLURM_JOB_NODELIST: which nodes it holds is unknown",
            f"{run_on_node}; do not set SLURM_JOB_ID by hand",
        )
    try:
        nodes = node_names(nodelist, environ)
    except ValueError as exc:
        return failed(
            LOGIN_NODE,
            f"cannot read SLURM_JOB_NODELIST={nodelist!r}: {exc}",
            f"{run_on_node}; do not set SLURM_JOB_NODELIST by hand",
        )
    hostname = socket.gethostname() if hostname is None else hostname
    if this_host_names(environ, hostname).isdisjoint(nodes):
        return failed(
            LOGIN_NODE,
            f"this host ({hostname}) is not a node of Slurm job {job} ({nodelist}): an salloc "
            "shell runs on the login node, where the stack must not start",
            run_on_node,
        )
    return passed(LOGIN_NODE, f"this host is a node of Slurm job {job} ({nodelist})")


def check_tool_calling_flags(arm: Arm, *, vllm_venv: Path | None) -> GateResult:
    """Gate 4: an arm with tool calling declares its parser, one the venv's vLLM registers.

    `vllm_venv` is None when no vLLM is started from a venv (local profile, an endpoint or an
    attached stack): then the parser is not checked here (the dynamic probe is the proof).
    """
    settings = arm.vllm
    if not settings.enable_tool_calling:
        return passed(
            TOOL_CALLING_FLAGS,
            "tool calling is off in the arm: the tool-capability probe decides after the start",
        )
    parser = settings.tool_call_parser
    if not parser:
        return failed(
            TOOL_CALLING_FLAGS,
            f"arm {arm.name} enables tool calling without a tool_call_parser: vLLM needs "
            "--enable-auto-tool-choice --tool-call-parser <name>",
            f'set [vllm] tool_call_parser = "<name>" in {_arm_file(arm)} (e.g. "hermes")',
        )
    flags = f"--enable-auto-tool-choice --tool-call-parser {parser}"
    if vllm_venv is None:
        return passed(TOOL_CALLING_FLAGS, f"{flags} (parser not checked: no vLLM venv)")
    try:
        install = find_vllm(vllm_venv)
    except FileNotFoundError as exc:
        return passed(TOOL_CALLING_FLAGS, f"{flags} (parser not checked: {exc})")
    names = tool_parser_names(install.package_dir)
    if not names:
        return passed(
            TOOL_CALLING_FLAGS,
            f"{flags} (parser not checked: no registered parser names found in "
            f"{install.describe()}; vLLM refuses an unknown one at its start)",
        )
    if parser not in names:
        return failed(
            TOOL_CALLING_FLAGS,
            f"tool_call_parser {parser!r} of arm {arm.name} is not a parser of "
            f"{install.describe()}; it has: {', '.join(sorted(names))}",
            f"set [vllm] tool_call_parser in {_arm_file(arm)} to one of those (the one for "
            "the model's chat template), or point VLLM_VENV at a vLLM that has it",
        )
    return passed(
        TOOL_CALLING_FLAGS, f"{flags}; {install.describe()} registers {len(names)} parsers"
    )


def count_visible_gpus(value: str) -> int:
    """The devices CUDA sees for a ``CUDA_VISIBLE_DEVICES`` value: indices or UUIDs, up to the
    first invalid entry (CUDA stops there; Slurm writes ``NoDevFiles`` for none)."""
    count = 0
    for entry in value.split(","):
        if not _GPU_ENTRY.match(entry.strip()):
            break
        count += 1
    return count


def check_parallel_width(
    arm: Arm, environ: Mapping[str, str], *, cluster: bool, starts_vllm: bool = True
) -> GateResult:
    """Gate 5: the GPUs this job may use (``CUDA_VISIBLE_DEVICES``) == TP x DP of the arm."""
    tp, dp = arm.vllm.tensor_parallel_size, arm.vllm.data_parallel_size
    wanted = tp * dp
    if not cluster or not starts_vllm:
        reason = _LOCAL if not cluster else "no vLLM started here"
        return passed(PARALLEL_WIDTH, f"{reason}: no GPU check")
    ask = (
        f"ask Slurm for {wanted} GPU{'s' if wanted != 1 else ''} ([slurm] gres = "
        f'"gpu:{wanted}" in {_arm_file(arm)}, or --gres=gpu:{wanted}), or change [vllm] '
        "tensor_parallel_size / data_parallel_size"
    )
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return failed(
            PARALLEL_WIDTH,
            f"CUDA_VISIBLE_DEVICES is unset: this job was given no GPUs, and arm {arm.name} "
            f"needs tensor_parallel_size {tp} x data_parallel_size {dp} = {wanted}",
            ask,
        )
    visible = count_visible_gpus(value)
    if visible != wanted:
        return failed(
            PARALLEL_WIDTH,
            f"this job may use {visible} GPU{'s' if visible != 1 else ''} "
            f"(CUDA_VISIBLE_DEVICES={value!r}) but arm {arm.name} needs tensor_parallel_size "
            f"{tp} x data_parallel_size {dp} = {wanted}",
            ask,
        )
    return passed(PARALLEL_WIDTH, f"{visible} GPUs visible = TP {tp} x DP {dp}")


def check_one_node(environ: Mapping[str, str], *, cluster: bool) -> GateResult:
    """Gate 6: the job has exactly one node (``SLURM_JOB_NUM_NODES``, ``SLURM_NNODES``, else
    the length of ``SLURM_JOB_NODELIST``)."""
    if not cluster:
        return passed(ONE_NODE, f"{_LOCAL}: no Slurm node check")
    fix = "submit with --nodes=1 (everything of a run lives on one node's 127.0.0.1)"
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        value = environ.get(name)
        if value:
            if value.strip() == "1":
                return passed(ONE_NODE, f"{name}=1")
            return failed(ONE_NODE, f"the job has {value} nodes ({name}), not one", fix)
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        return failed(
            ONE_NODE,
            "neither SLURM_JOB_NUM_NODES, SLURM_NNODES nor SLURM_JOB_NODELIST is set: the "
            "number of nodes is unknown",
            "run inside a Slurm job of one node (sbatch --nodes=1, or salloc --nodes=1)",
        )
    try:
        count = len(node_names(nodelist, environ))
    except ValueError as exc:
        return failed(ONE_NODE, f"cannot read SLURM_JOB_NODELIST={nodelist!r}: {exc}", fix)
    if count != 1:
        return failed(ONE_NODE, f"the job has {count} nodes ({nodelist}), not one", fix)
    return passed(ONE_NODE, f"one node ({nodelist})")


def check_vllm_environment(
    environ: Mapping[str, str],
    *,
    vllm_venv: Path | None,
    needs_vllm: bool,
    needs_apptainer: bool,
) -> GateResult:
    """Gate 7: the vLLM venv has vllm (spec and version, not imported); apptainer is on PATH.

    `needs_vllm`: this run starts vLLM from the venv (cluster profile without an endpoint or
    an attached stack); `needs_apptainer`: it runs images (cluster profile).
    """
    seen: list[str] = []
    if needs_vllm:
        venv_fix = (
            "set VLLM_VENV in cluster.env (or the environment) and build it with `haico env` "
            "(from the lock VLLM_REQUIREMENTS names), or use --haico-model-endpoint URL for a "
            "running server"
        )
        if vllm_venv is None:
            return failed(VLLM_ENVIRONMENT, "VLLM_VENV is not set: no vLLM to start", venv_fix)
        try:
            install = find_vllm(vllm_venv)
        except FileNotFoundError as exc:
            return failed(VLLM_ENVIRONMENT, f"VLLM_VENV={vllm_venv}: {exc}", venv_fix)
        seen.append(install.describe())
    if needs_apptainer:
        apptainer = shutil.which("apptainer", path=environ.get("PATH"))
        if apptainer is None:
            return failed(
                VLLM_ENVIRONMENT,
                "apptainer is not on PATH: Postgres and the backend run from images",
                "load it (e.g. `module load apptainer`) in the job script before pytest, or "
                "add its bin directory to PATH",
            )
        seen.append(f"apptainer at {apptainer}")
    return passed(VLLM_ENVIRONMENT, "; ".join(seen) or f"{_LOCAL}: stand-ins, no vLLM venv")


def check_walltime(
    remaining_s: float | None,
    slowest_s: float | None,
    *,
    drain_margin_s: float,
    stratum: str,
) -> GateResult:
    """Gate 10: the job's remaining time covers the stratum's slowest measured item plus the
    drain margin.

    `remaining_s`: seconds to the job's end (None: no job, or no end time known);
    `slowest_s`: the longest measured item of the stratum in earlier ledgers (None: none).
    With several strata, pass the one with the shortest slowest item: a run that can finish
    one item is worth starting (admission keeps the longer ones out).
    """
    if remaining_s is None:
        return passed(WALLTIME, "no walltime: not in a Slurm job, or its end time is unknown")
    if slowest_s is None:
        return passed(WALLTIME, f"no history: no measured item of stratum {stratum} yet")
    needed = slowest_s + drain_margin_s
    at_least = format_duration(needed)
    numbers = (
        f"the job ends in {format_duration(remaining_s)}; the slowest item of stratum {stratum} "
        f"took {format_duration(slowest_s)} + {drain_margin_s:g} s drain margin = {at_least}"
    )
    if remaining_s < needed:
        return failed(
            WALLTIME,
            f"{numbers}: not even that item could finish",
            f"resubmit with a longer --time (at least {at_least}; `haico cost` "
            "prints what to ask for), or select a cheaper stratum with --haico-stratum",
        )
    return passed(WALLTIME, numbers)


def check_output_collision(
    *, claimed: bool, share: str, holder: str | None = None, claim_path: Path | None = None
) -> GateResult:
    """Gate 11: this run holds its run directory and its share (``claim_share`` succeeded).

    `share` names it ("arm demo, shard 0/1, stratum default"); `holder` describes the live run
    that holds it (``ShareClaimedError.holder.describe()``), `claim_path` the claim file.
    """
    if claimed:
        return passed(OUTPUT_COLLISION, f"{share}: claimed by this run")
    who = holder or "another live run"
    remove = f"remove {claim_path}" if claim_path is not None else "remove its claim file"
    return failed(
        OUTPUT_COLLISION,
        f"{share} is being run by {who}: a second run would run its items again",
        f"let that run finish or cancel it (scancel); if it is dead (e.g. its node failed), "
        f"{remove}, then rerun",
    )
