"""Static gates over files: the inputs are present and readable, and are the frozen ones of
their submission (gate 8); the results directory takes writes, fsyncs and has room (gate 9)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_haico.config.experiment import Arm
from pytest_haico.config.frozen import INPUTS_DIGEST_ENV, inputs_digest, is_digest
from pytest_haico.errors import ConfigError
from pytest_haico.files import (
    NotAnInputError,
    create_file,
    describe_filesystem,
    file_kind,
    make_dirs,
    read_input_file,
    write_all,
)
from pytest_haico.gates.result import GateResult, failed, passed

INPUTS_PRESENT = "inputs_present"
RESULTS_WRITABLE = "results_writable"
NODE_TMPDIR = "node_tmpdir"

RESULTS_FIX = (
    "use a writable file system with enough free space: --haico-results DIR (ini "
    "haico_results, env PYTEST_HAICO_RESULTS), or CLUSTER_WORK (results go to "
    "$CLUSTER_WORK/results)"
)
FROZEN_FIX = (
    "the frozen inputs of this submission were edited after `haico submit`: restore them, "
    "or submit again (a new submission) to run the edit"
)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# A model's config.json, its shard index or a cache ref, read whole: opened without waiting
# (a FIFO in a shared cache must not hang the gate and the allocation with it), and bounded.
MODEL_FILE_MAX_BYTES = 64 * 1024 * 1024
# The weights' index (or single file), best first; vLLM loads each format.
_WEIGHTS = (
    ("model.safetensors.index.json", True),
    ("model.safetensors", False),
    ("pytorch_model.bin.index.json", True),
    ("pytorch_model.bin", False),
)


def resolve_hf_cache(environ: Mapping[str, str], hf_home: str | Path | None = None) -> Path:
    """The Hugging Face hub cache as huggingface_hub finds it: ``HF_HUB_CACHE``, else
    ``<HF_HOME>/hub`` (`hf_home` from cluster.env wins over the environment's), else
    ``~/.cache/huggingface/hub``."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"])
    home = hf_home or environ.get("HF_HOME")
    if home:
        return Path(home) / "hub"
    return Path(environ.get("HOME") or Path.home()) / ".cache" / "huggingface" / "hub"


def check_inputs_present(
    arm: Arm,
    *,
    needs_weights: bool,
    hf_cache: Path,
    scripts: Sequence[Path],
    images: Sequence[Path] = (),
) -> GateResult:
    """Gate 8: the arm's weights (a directory, or an HF id + revision in the local cache, read
    as with ``HF_HUB_OFFLINE=1``), the image files and the script files exist and are readable.

    `needs_weights`: this run starts vLLM on the arm's weights (cluster profile without an
    endpoint or an attached stack); `images`: SIF files the run executes.
    """
    seen: list[str] = []
    if needs_weights:
        found = _check_weights(arm, hf_cache)
        if isinstance(found, GateResult):
            return found
        seen.append(found)
    for image in images:
        problem = _unreadable(image)
        if problem is not None:
            return failed(
                INPUTS_PRESENT,
                f"the image {image} {problem}",
                "pull the images first with `haico env` (every image the arms and cluster.env "
                "name, into SIF_DIR), or fix the path in cluster.env "
                "(BACKEND_IMAGE, POSTGRES_IMAGE, SIF_DIR) or --haico-backend-image",
            )
    if images:
        seen.append(f"{len(images)} image{'s' if len(images) != 1 else ''}")
    for script in scripts:
        problem = _unreadable(script)
        if problem is not None:
            return failed(
                INPUTS_PRESENT,
                f"the script file {script} {problem}",
                "restore the file or its permissions (scripts are read again while the run "
                "goes), or remove it from the experiments directory",
            )
    seen.append(f"{len(scripts)} script file{'s' if len(scripts) != 1 else ''} readable")
    return passed(INPUTS_PRESENT, "; ".join(seen))


def check_frozen_inputs(
    experiments: Path, cluster_env: Path | None, *, expected: str
) -> GateResult:
    """Gate 8, for a job of `haico submit`: the experiments directory and cluster.env
    digest to `expected`, the digest the submission took of them (``$HAICO_INPUTS_DIGEST``)."""
    if not is_digest(expected):
        shown = expected if len(expected) <= 80 else expected[:77] + "..."
        return failed(
            INPUTS_PRESENT,
            f"{INPUTS_DIGEST_ENV}={shown!r} is not a digest of frozen inputs "
            "(sha256: and 64 lower-case hex digits)",
            f"`haico submit` sets {INPUTS_DIGEST_ENV} for the jobs it submits: submit again, "
            "or unset it to run these inputs without the check",
        )
    inputs = f"{experiments}" + (f" and {cluster_env}" if cluster_env is not None else "")
    try:
        actual = inputs_digest(experiments, cluster_env)
    except ConfigError as exc:
        return failed(
            INPUTS_PRESENT,
            f"cannot digest the frozen inputs {inputs}: {exc}",
            f"{FROZEN_FIX} (or repair what the message names)",
        )
    if actual != expected:
        return failed(
            INPUTS_PRESENT,
            f"the inputs {inputs} digest to {_short(actual)}, not to {_short(expected)} "
            f"(${INPUTS_DIGEST_ENV}, taken at submission)",
            FROZEN_FIX,
        )
    return passed(INPUTS_PRESENT, f"the frozen inputs of the submission ({_short(actual)})")


def _short(digest: str) -> str:
    """``sha256:<12 hex>``: enough to tell two digests apart in a message."""
    return digest[: len("sha256:") + 12]


def _check_weights(arm: Arm, hf_cache: Path) -> GateResult | str:
    model = arm.model
    arm_file = f"arms/{arm.name}.toml"
    if model.path:
        directory = Path(model.path)
        problem, what = _weights_problem(directory)
        if problem is not None:
            return failed(
                INPUTS_PRESENT,
                f"model directory {directory} of arm {arm.name}: {problem}",
                f"fix [model] path in {arm_file}, or complete the copy of the model there "
                "(config.json and every shard of the index)",
            )
        return f"model {directory}: {what}"
    if model.hf_id:
        revision = model.revision or "main"
        download = (
            f"download it where there is network: `HF_HUB_CACHE={hf_cache} hf download "
            f"{model.hf_id} --revision {revision}` (jobs read the cache offline, "
            "HF_HUB_OFFLINE=1), or fix HF_HOME in cluster.env"
        )
        snapshot, problem = _hf_snapshot(hf_cache, model.hf_id, revision)
        if snapshot is None:
            return failed(INPUTS_PRESENT, problem, download)
        problem, what = _weights_problem(snapshot)
        if problem is not None:
            return failed(
                INPUTS_PRESENT,
                f"{model.hf_id} at revision {revision} in {hf_cache}: {problem} "
                "(an interrupted download?)",
                download,
            )
        pinned = "" if model.revision else " (not pinned: set [model] revision)"
        return f"{model.hf_id}@{revision} in the HF cache{pinned}: {what}"
    return failed(
        INPUTS_PRESENT,
        f"arm {arm.name} names no weights: vLLM has nothing to load",
        f'set [model] path = "/path/to/model" or hf_id + revision in {arm_file}',
    )


def _hf_snapshot(cache: Path, hf_id: str, revision: str) -> tuple[Path | None, str]:
    """The snapshot directory of `hf_id` at `revision` (a commit, or a branch or tag name
    resolved through ``refs/``), or None and what is missing."""
    repo = cache / ("models--" + hf_id.replace("/", "--"))
    if not repo.is_dir():
        return None, f"{hf_id} is not in the Hugging Face cache {cache} (no {repo.name})"
    if _COMMIT.match(revision):
        commit = revision
    else:
        ref = repo / "refs" / revision
        try:
            commit = read_input_file(ref, max_bytes=MODEL_FILE_MAX_BYTES).decode().strip()
        except NotAnInputError as exc:
            return None, f"revision {revision!r} of {hf_id}: {ref} {exc.problem}"
        except (OSError, ValueError):
            return None, f"revision {revision!r} of {hf_id} is not in the cache (no {ref})"
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        return None, f"revision {revision!r} of {hf_id} is not in the cache (no {snapshot})"
    return snapshot, ""


def _weights_problem(directory: Path) -> tuple[str | None, str]:
    """(what is wrong, None when nothing; what was found) for a model directory."""
    if not directory.is_dir():
        return "not a directory", ""
    try:
        json.loads(read_input_file(directory / "config.json", max_bytes=MODEL_FILE_MAX_BYTES))
    except FileNotFoundError:
        return "no config.json", ""
    except (OSError, ValueError) as exc:
        return f"config.json is unreadable or not JSON ({exc})", ""
    for name, is_index in _WEIGHTS:
        path = directory / name
        if not path.exists():
            continue
        if not is_index:
            problem = _unreadable(path)
            return (None, f"config.json + {name}") if problem is None else (f"{name} {problem}", "")
        return _index_problem(path)
    names = " or ".join(name for name, _ in _WEIGHTS[:2])
    return f"no weights: neither {names} (nor a pytorch_model.bin index)", ""


def _index_problem(index: Path) -> tuple[str | None, str]:
    try:
        document = json.loads(read_input_file(index, max_bytes=MODEL_FILE_MAX_BYTES))
        weight_map = document["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{index.name} is unreadable or has no weight_map ({exc!r})", ""
    # A cache snapshot holds symlinks to blobs: a shard whose download never finished is a
    # dangling link, which exists() sees through.
    missing = [shard for shard in shards if not (index.parent / shard).exists()]
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        return f"{index.name} lists shards that are missing: {shown}", ""
    return None, f"config.json + {index.name} ({len(shards)} shards)"


def _unreadable(path: Path) -> str | None:
    """None when `path` is a regular file this process can open and read, else why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    with os.fdopen(fd, "rb") as handle:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind != "regular file":
            return f"is a {kind}, not a regular file"
        try:
            handle.read(1)
        except OSError as exc:
            return f"cannot be read: {exc.strerror or exc}"
    return None


def check_results_writable(results_dir: Path, *, bytes_needed: int, file_mode: int) -> GateResult:
    """Gate 9: a probe file in `results_dir` (made with the results mode if missing) is
    written, fsynced and removed, and its file system has `bytes_needed` free (the dumps)."""
    probe = results_dir / f".haico-probe.{socket.gethostname()}.{os.getpid()}"
    try:
        make_dirs(results_dir, file_mode)
        probe.unlink(missing_ok=True)  # left by a killed process that had our pid
        fd = create_file(probe, file_mode)
        try:
            write_all(fd, b"pytest-haico write probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
        stats = os.statvfs(results_dir)
    except OSError as exc:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
        return failed(
            RESULTS_WRITABLE,
            f"cannot write to the results directory {results_dir}: {exc} on "
            f"{describe_filesystem(results_dir)}",
            RESULTS_FIX,
        )
    free = stats.f_bavail * stats.f_frsize
    if free < bytes_needed:
        return failed(
            RESULTS_WRITABLE,
            f"{format_bytes(free)} free on {describe_filesystem(results_dir)}, but the "
            f"database dumps need {format_bytes(bytes_needed)}",
            f"free space there, or {RESULTS_FIX}",
        )
    return passed(
        RESULTS_WRITABLE,
        f"write + fsync in {results_dir}; {format_bytes(free)} free "
        f"({format_bytes(bytes_needed)} needed)",
    )


def check_node_tmpdir(environ: Mapping[str, str]) -> GateResult:
    """Gate node_tmpdir: the node-local ``$TMPDIR`` (the stack's databases, sockets and
    state; /tmp without it) takes a probe file, written, fsynced and removed. Python would
    otherwise fall back to another directory unasked: a node whose disk failed fails here,
    and `haico continue` reruns its shares on other nodes."""
    directory = Path(environ.get("TMPDIR") or "/tmp")
    probe = directory / f".haico-probe.{socket.gethostname()}.{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            write_all(fd, b"pytest-haico write probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as exc:
        return failed(
            NODE_TMPDIR,
            f"cannot write to this node's TMPDIR {directory}: {exc.strerror or exc} on "
            f"{describe_filesystem(directory)}",
            "the node's local disk: `haico continue` reruns the share on other nodes (and "
            "excludes this one once failures cluster on it); outside a job, set TMPDIR to a "
            "writable local directory",
        )
    return passed(NODE_TMPDIR, f"write + fsync in {directory}")


def format_bytes(count: int) -> str:
    """A byte count for a message: ``512 B``, ``64.0 KiB``, ``1.5 GiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
