"""One arm's ledgers and run directories as `haico continue` reads them, once: each item's
newest record, what the runs of each Slurm job part recorded, their gates, and the node
each run ran on."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from pytest_haico.errors import UntrustedFileError
from pytest_haico.files import read_owned_file
from pytest_haico.ledger.format import RawRecord, iter_ledger_dir
from pytest_haico.ledger.layout import CLAIM_FILE, RUN_CONFIG_JSON, ArmPaths
from pytest_haico.ledger.resume import ResumeIndex
from pytest_haico.ledger.rundir import check_arm_dirs, job_key_of, runs_of
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.slurm.records import TaskState
from pytest_haico.submit.decisions import GateFailure, RunGates
from pytest_haico.submit.jobs import Say
from pytest_haico.submit.nodes import NODE_STATES, Placement

_TERMINAL = frozenset(verdict for verdict in Verdict if verdict.is_terminal)
# What a run records when the model server or the backend failed it (the node's side).
_INFRA = frozenset({Verdict.INFRA_ERROR.value, Verdict.GAVE_UP.value})


class ArmLedger:
    """One arm's ledgers read once: each item's newest record, and how many terminal and
    infrastructure-failed records each run and each Slurm job part wrote."""

    def __init__(self, arm: str, paths: ArmPaths, say: Say) -> None:
        self.arm = arm
        self.paths = paths
        self.index = ResumeIndex()
        self.terminal: Counter[str] = Counter()  # by job part (``13_1``)
        self.run_terminal: Counter[str] = Counter()  # by run_id (``13_1r1.1``)
        self.run_infra: Counter[str] = Counter()

        def warn(message: str) -> None:
            say(f"haico: ledger warning: {message}")

        check_arm_dirs(paths)  # what is owed is only what this user's own ledgers say
        records = iter_ledger_dir(paths.ledger_dir, warn=warn, resume_fields=True)
        self.index.add_all(self._tallied(records), warn=warn)

    def _tallied(self, records: Iterable[RawRecord]) -> Iterator[RawRecord]:
        for record in records:
            run_id = record.path.stem
            key = job_key_of(run_id)
            verdict = record.data.get("verdict")
            if verdict in _TERMINAL:
                self.run_terminal[run_id] += 1
                if key is not None:
                    self.terminal[key] += 1
            if verdict in _INFRA:
                self.run_infra[run_id] += 1
            yield record

    def gates(self, key: str) -> RunGates | None:
        """What the gates.json of job part `key`'s newest run that has one says; None when
        none has one, or it is not this user's own readable file."""
        for run in reversed(runs_of(self.paths, key)):
            try:
                return _run_gates(run)
            except FileNotFoundError:
                continue
            except (UntrustedFileError, OSError, ValueError):
                return None  # the decision then names the job's log instead
        return None

    def failed_gate(self, key: str) -> GateFailure | None:
        """The failed gate of job part `key`'s newest run with a gates.json; None when it has
        none, or none failed."""
        gates = self.gates(key)
        return None if gates is None else gates.failure

    def placements(self, key: str, end: TaskState | None) -> list[Placement]:
        """Every run of job part `key` (requeues included), and the Slurm attempt itself
        when Slurm says its node failed it."""
        found = []
        for run in runs_of(self.paths, key):
            run_id = run.name
            try:
                gates: RunGates | None = _run_gates(run)
            except (UntrustedFileError, OSError, ValueError):
                gates = None
            terminal, infra = self.run_terminal[run_id], self.run_infra[run_id]
            failure = None
            if infra and infra >= terminal:
                failure = f"{infra} of its {infra + terminal} records infrastructure failures"
            found.append(
                Placement(
                    arm=self.arm,
                    attempt=run_id,
                    node=_run_node(run),
                    failure=failure,
                    fruitful=terminal > 0,
                    passed_gates=gates.passed if gates else frozenset(),
                    failed_gate=gates.failure.name if gates and gates.failure else None,
                )
            )
        if end is not None and end.state in NODE_STATES:
            found.append(Placement(arm=self.arm, attempt=key, node=end.node, failure=end.state))
        return found


def _run_gates(run: Path) -> RunGates:
    """A run's gates.json: its failed gate and the gates it passed. `FileNotFoundError` when
    it has none; `UntrustedFileError`, `OSError` or `ValueError` when it cannot be trusted
    or read."""
    document = json.loads(read_owned_file(run / "gates.json"))
    gates = [g for g in document.get("gates", ()) if isinstance(g, dict)]
    failed = next((g for g in gates if g.get("passed") is False), None)
    failure = None
    if failed is not None:
        failure = GateFailure(
            str(failed.get("name", "?")),
            str(failed.get("detail", "")),
            str(failed.get("fix", "")),
        )
    names = frozenset(str(g.get("name")) for g in gates if g.get("passed") is True)
    return RunGates(failure, passed=names)


def _run_node(run: Path) -> str | None:
    """The node the run recorded in its run-config (NODE), else in its claim (a run stopped
    by a gate writes no run-config); None when it left neither."""
    for name, key in ((RUN_CONFIG_JSON, "NODE"), (CLAIM_FILE, "node")):
        try:
            data = json.loads(read_owned_file(run / name))
        except (UntrustedFileError, OSError, ValueError):
            continue
        values = data.get("values", data) if isinstance(data, dict) else None
        node = values.get(key) if isinstance(values, dict) else None
        if node:
            return str(node)
    return None
