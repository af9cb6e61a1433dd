"""The GPU check (`haico gpu-check`) on the node it runs on: the devices this allocation sees
against the count it should have, a matrix-multiply burn on each with the venv's torch
(`gpu_burn.py`) at a memory fraction for a time, nvidia-smi's per-second log of every device
into a file per node, and each device's TFLOP/s against a floor, so that a slow or faulty
card fails before a campaign is sent to it."""

from __future__ import annotations

import csv
import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_haico.errors import HaicoError
from pytest_haico.files import DEFAULT_FILE_MODE, make_dirs
from pytest_haico.stamps import utc_name

BURN = Path(__file__).with_name("gpu_burn.py")
QUERY = (
    "index,uuid,utilization.gpu,power.draw,temperature.gpu,ecc.errors.uncorrected.volatile.total"
)
# `RuntimeError: CUDA error: ...`, `torch.AcceleratorError: ...`: a traceback's last exception.
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*:")
# Importing torch from a shared file system and initialising CUDA, beyond the burn's time.
START_GRACE_S = 180.0
_STOP_GRACE_S = 10.0


class GpuCheckError(HaicoError):
    """The check cannot run as asked (no venv, no nvidia-smi); the message says what to do."""


@dataclass(frozen=True)
class BurnSettings:
    """How hard and how long each device is driven, and what it must achieve."""

    seconds: float = 30.0
    memory_fraction: float = 0.5
    size: int = 8192
    dtype: str = "float32"
    min_tflops: float | None = None
    device: str = "cuda"  # "cpu": the burns run on the CPU (a node without CUDA, the tests)


# The seed's hardware validation: ten minutes of 32,768 x 32,768 matmuls at 75% memory.
FULL = BurnSettings(seconds=600.0, memory_fraction=0.75, size=32768)


@dataclass(frozen=True)
class DeviceResult:
    """One device's burn and samples; `problem` None when it passed."""

    visible: str  # its CUDA_VISIBLE_DEVICES entry
    tflops: float | None
    memory_held: float | None  # the share of the device's memory held during the burn
    samples: int
    max_temperature: float | None
    max_power: float | None
    ecc_errors: int | None
    problem: str | None


def visible_devices(environ: Mapping[str, str]) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries (indexes or GPU UUIDs) this job may use."""
    return [
        entry.strip()
        for entry in environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        if entry.strip()
    ]


def run_gpu_check(
    *,
    python: Path,
    expected: int | None,
    settings: BurnSettings,
    log_dir: Path,
    environ: Mapping[str, str],
    say: Callable[[str], None],
) -> bool:
    """Check this node's devices; whether all passed. Each device gets one line."""
    host = socket.gethostname().split(".")[0]
    visible = visible_devices(environ)
    shown = environ.get("CUDA_VISIBLE_DEVICES", "")
    if expected is not None and len(visible) != expected:
        say(
            f"haico gpu-check: {host}: {len(visible)} device(s) visible "
            f"(CUDA_VISIBLE_DEVICES={shown!r}), the allocation has {expected}: a card is "
            "missing or the job asked for another count; FAILED"
        )
        return False
    if not visible:
        say(f"haico gpu-check: {host}: no device visible (CUDA_VISIBLE_DEVICES={shown!r}); FAILED")
        return False
    if not python.is_file():
        raise GpuCheckError(f"{python} does not exist: build VLLM_VENV with `haico env` first")
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        raise GpuCheckError("nvidia-smi is not on PATH: run the check on a GPU node")
    make_dirs(log_dir, DEFAULT_FILE_MODE)
    log = log_dir / f"gpu-{host}-{utc_name()}.csv"
    outputs = _burn_while_logging(
        smi, log, python=python, count=len(visible), settings=settings, environ=environ
    )
    samples = _read_samples(log)
    results = [
        _judge(entry, position, outputs[position], samples, settings)
        for position, entry in enumerate(visible)
    ]
    for result in results:
        say(_describe(host, result, settings))
    failed = [result for result in results if result.problem is not None]
    say(
        f"haico gpu-check: {host}: {len(results) - len(failed)} of {len(results)} device(s) "
        f"passed; samples every second in {log}"
    )
    return not failed


def _burn_while_logging(
    smi: str,
    log: Path,
    *,
    python: Path,
    count: int,
    settings: BurnSettings,
    environ: Mapping[str, str],
) -> list[tuple[int, str, str]]:
    """Each device's burn (exit status, stdout, stderr), nvidia-smi logging meanwhile."""
    with log.open("w", encoding="utf-8") as out:
        logger = subprocess.Popen(
            [smi, f"--query-gpu={QUERY}", "--format=csv", "-lms", "1000"],
            stdout=out,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env=dict(environ),
        )
        burns: list[subprocess.Popen[str]] = []
        try:
            for position in range(count):
                device = "cpu" if settings.device == "cpu" else f"cuda:{position}"
                argv = [str(python), str(BURN), "--device", device]
                argv += ["--seconds", str(settings.seconds), "--size", str(settings.size)]
                argv += ["--memory-fraction", str(settings.memory_fraction)]
                argv += ["--dtype", settings.dtype]
                burns.append(
                    subprocess.Popen(
                        argv,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        stdin=subprocess.DEVNULL,
                        text=True,
                        env=dict(environ),
                    )
                )
            deadline = time.monotonic() + settings.seconds + START_GRACE_S
            outputs = []
            for burn in burns:
                try:
                    stdout, stderr = burn.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    burn.kill()
                    stdout, stderr = burn.communicate()
                    stderr += "\nthe burn did not finish in time"
                outputs.append((burn.returncode, stdout, stderr))
            return outputs
        finally:
            for burn in burns:
                if burn.poll() is None:
                    burn.kill()
                    burn.wait()
            logger.terminate()
            try:
                logger.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                logger.kill()
                logger.wait()


def _read_samples(log: Path) -> list[dict[str, str]]:
    """nvidia-smi's CSV rows, keyed by the query's field names (its header adds units)."""
    names = QUERY.split(",")
    rows = []
    with log.open(encoding="utf-8", errors="replace") as lines:
        for row in csv.reader(lines, skipinitialspace=True):
            if len(row) == len(names) and not row[0].startswith("index"):
                rows.append(dict(zip(names, (cell.strip() for cell in row), strict=True)))
    return rows


def _number(text: str) -> float | None:
    """`300.25 W`, `97 %`, `65` -> the number; `[N/A]`, `[Not Supported]` -> None."""
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def _burn_result(stdout: str) -> dict[str, Any]:
    """The burn's JSON line (its result or its error); {} when it printed none."""
    try:
        result = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    return result if isinstance(result, dict) else {}


def _error_line(stderr: str) -> str:
    """The exception's line of a burn that died before it could say (an interpreter that
    cannot start, a crash in an import), else the last line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    raised = [line for line in lines if _RAISED.match(line)]
    return (raised or lines or ["no output"])[-1]


def _judge(
    entry: str,
    position: int,
    output: tuple[int, str, str],
    samples: Sequence[dict[str, str]],
    settings: BurnSettings,
) -> DeviceResult:
    key = "uuid" if entry.startswith(("GPU-", "MIG-")) else "index"
    own = [row for row in samples if row[key] == entry]
    temperatures = [t for row in own if (t := _number(row["temperature.gpu"])) is not None]
    powers = [p for row in own if (p := _number(row["power.draw"])) is not None]
    ecc = [int(e) for row in own if (e := _number(row["ecc.errors.uncorrected.volatile.total"]))]
    status, stdout, stderr = output
    burn = _burn_result(stdout)
    tflops = None
    problem = None
    try:
        tflops = float(burn["tflops"])
    except (ValueError, KeyError, TypeError):
        said = burn.get("error") or _error_line(stderr)
        problem = f"the burn on device {position} failed (exit {status}): {said}"
    held = burn.get("memory_held")
    if problem is None and not own:
        problem = f"nvidia-smi logged no sample of device {entry}: is it on the bus?"
    if problem is None and ecc and max(ecc) > 0:
        problem = f"{max(ecc)} uncorrected ECC error(s)"
    floor = settings.min_tflops
    if problem is None and tflops is not None and floor is not None and tflops < floor:
        problem = f"{tflops:.3g} TFLOP/s is below the floor of {floor:g}"
    return DeviceResult(
        visible=entry,
        tflops=tflops,
        memory_held=float(held) if isinstance(held, int | float) else None,
        samples=len(own),
        max_temperature=max(temperatures, default=None),
        max_power=max(powers, default=None),
        ecc_errors=max(ecc, default=0) if own else None,
        problem=problem,
    )


def _describe(host: str, result: DeviceResult, settings: BurnSettings) -> str:
    """ "n1 device 0: 53.1 TFLOP/s (floor 30), 75% of its memory held, 600 samples (max 60 C,
    700 W, ECC 0); ok"."""
    line = f"haico gpu-check: {host} device {result.visible}: "
    if result.tflops is not None:
        floor = f" (floor {settings.min_tflops:g})" if settings.min_tflops is not None else ""
        line += f"{result.tflops:.3g} TFLOP/s{floor}, "
    if result.memory_held is not None:
        line += f"{result.memory_held:.0%} of its memory held, "
    seen = []
    if result.max_temperature is not None:
        seen.append(f"max {result.max_temperature:g} C")
    if result.max_power is not None:
        seen.append(f"{result.max_power:g} W")
    if result.ecc_errors is not None:
        seen.append(f"ECC {result.ecc_errors}")
    line += f"{result.samples} samples" + (f" ({', '.join(seen)})" if seen else "")
    return line + ("; ok" if result.problem is None else f"; FAILED: {result.problem}")
