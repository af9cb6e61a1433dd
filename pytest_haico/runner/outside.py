"""How an arm run reaches past its own process: the stack it opens, the channel to that
stack, the database dumps, the model server's own account. A run uses `Outside()`; the arm
lifecycle's unit tests give fakes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.provenance.dumps import DatabaseDumps, run_dumps_dir
from pytest_haico.provenance.runconfig import model_server_metrics, model_server_values
from pytest_haico.redact import Redactor
from pytest_haico.runner.arm_provenance import Dumps, ModelServerMetrics, ModelServerValues
from pytest_haico.runner.arm_request import ArmRunRequest
from pytest_haico.runner.channel import BackendChannel, Channel
from pytest_haico.runner.stack_life import RunStack
from pytest_haico.stack.arm_stack import build_arm_stack
from pytest_haico.stack.attached import AttachedStack
from pytest_haico.stack.kept import KeptState
from pytest_haico.stack.profiles import Stack
from pytest_haico.stack.request import StackRequest


def open_stack(source: StackRequest | KeptState) -> RunStack:
    """The arm's stack, not yet started: built from its request, or the kept one attached."""
    if isinstance(source, KeptState):
        return AttachedStack(source)
    return build_arm_stack(source)


def open_dumps(stack: RunStack, request: ArmRunRequest, run_dir: Path) -> Dumps | None:
    """The pg_dumps into `<run_dir>/dumps` of a stack this run started; None for a kept
    stack (its supervisor runs them)."""
    if not isinstance(stack, Stack):
        return None
    return DatabaseDumps(
        stack.postgres,
        run_dumps_dir(run_dir),
        interval_s=request.dump_interval_s,
        file_mode=request.recorder.file_mode,
    )


@dataclass(frozen=True)
class Outside:
    """The arm run's ways out of its process."""

    open_stack: Callable[[StackRequest | KeptState], RunStack] = open_stack
    open_channel: Callable[[RunStack, ArmRunRequest, Redactor], Channel] = BackendChannel
    open_dumps: Callable[[RunStack, ArmRunRequest, Path], Dumps | None] = open_dumps
    model_server_values: ModelServerValues = model_server_values
    model_server_metrics: ModelServerMetrics = model_server_metrics
