"""Which judge scores an arm's `expect: {judge: ...}`, checked at configure time, and the
`Scorer` a conversation is given: the judge resolved in the catalogue, each turn put to the
hook `pytest_haico_judge_turn` in a worker thread.

The judge of an arm is `--haico-judge`, else the arm's `[run] judge`. At configure time an
arm whose scripts ask a judge must have one (a usage error otherwise). Static gate `judge`
resolves it at the start of each run, as gate served_model does the arm's model: a name the
catalogue does not have, cannot vouch for or whose job no longer runs is exit 78 before
anything starts. It is resolved again after the judge failed to answer: a requeued judge
registers again, and the next attempt finds it. A judge that cannot answer is infra.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from pytest_haico.config.experiment import Arm, ScriptSource
from pytest_haico.config.identity import parse_model_identity
from pytest_haico.config.validation import human_field
from pytest_haico.driver.judging import JudgedTurn, JudgeVerdict, ScoredTurn
from pytest_haico.errors import CatalogueError, ConfigError, JudgeError
from pytest_haico.gates.dynamic import JUDGE
from pytest_haico.gates.result import GateResult, failed, passed
from pytest_haico.ledger.records import JudgeRecord
from pytest_haico.serve.resolver import JobLookup, ServedModel, resolve_served
from pytest_haico.slurm.jobs import job_now

# `config.hook.pytest_haico_judge_turn`: keyword arguments `turn` and `judge`.
JudgeHook = Callable[..., JudgeVerdict | None]


def check_judges(
    arms: Iterable[Arm], scripts: Iterable[ScriptSource], *, option: str | None
) -> dict[str, str]:
    """Each arm's judge name (`option`, --haico-judge, else the arm's [run] judge), for the
    arms whose scripts ask a judge; a `ConfigError` naming the first script that asks one
    when an arm has none."""
    asking = [(source, index) for source in scripts for index in _judged_turns(source)]
    if not asking:
        return {}
    names: dict[str, str] = {}
    for arm in arms:
        name = option or arm.run.judge
        if name is None:
            source, index = asking[0]
            raise ConfigError(
                source.where,
                human_field(["turns", index, "expect", "judge"]),
                f"arm {arm.name} has no judge to ask: name the served judge model with "
                '--haico-judge NAME (or the arm\'s [run] judge = "NAME"; `haico serve '
                "--list` shows what is served)",
            )
        names[arm.name] = name
    return names


def _judged_turns(source: ScriptSource) -> list[int]:
    return [
        index
        for index, turn in enumerate(source.script.turns)
        if turn.expect is not None and turn.expect.judge is not None
    ]


def judge_record(judge: ServedModel, answer: str) -> JudgeRecord:
    """The ledger's record of who answered: the judge's name, model, vLLM and job."""
    return JudgeRecord(
        name=judge.name,
        served_name=judge.served_name,
        model=parse_model_identity(judge.identity.model),
        vllm_version=judge.identity.vllm_version,
        job_id=judge.entry.job.id,
        answer=answer,
    )


class TurnJudge:
    """An arm's `Scorer`: the served judge `name`, resolved once and again after a failure,
    each turn scored by the hook in a worker thread (an implementation may block)."""

    def __init__(
        self, name: str, *, catalogue: Path, hook: JudgeHook, lookup: JobLookup = job_now
    ) -> None:
        self.name = name
        self._catalogue = catalogue
        self._hook = hook
        self._lookup = lookup
        self._served: ServedModel | None = None
        self._lock = threading.Lock()

    def gate(self) -> GateResult:
        """Gate `judge`: the judge resolved afresh (kept for the first turn), or why not."""
        with self._lock:
            self._served = None
        try:
            served = self._resolve()
        except JudgeError as exc:
            return failed(
                JUDGE,
                str(exc),
                "serve it, or name another judge with --haico-judge or [run] judge; then rerun",
            )
        return passed(JUDGE, f"{self.name!r} at {served.endpoint}, job {served.entry.job.id}")

    async def __call__(self, turn: JudgedTurn) -> ScoredTurn:
        return await asyncio.to_thread(self._score, turn)

    def _score(self, turn: JudgedTurn) -> ScoredTurn:
        served = self._resolve()
        try:
            verdict = self._hook(turn=turn, judge=served)
        except Exception:
            self._forget(served)
            raise
        if not isinstance(verdict, JudgeVerdict):
            answered = "no implementation answered" if verdict is None else f"{verdict!r}"
            raise JudgeError(
                f"pytest_haico_judge_turn returned {answered}, not a JudgeVerdict "
                "(pytest_haico.driver.judging)"
            )
        return ScoredTurn(verdict=verdict, judge=judge_record(served, verdict.answer))

    def _resolve(self) -> ServedModel:
        with self._lock:
            if self._served is None:
                try:
                    self._served = resolve_served(
                        self.name, catalogue=self._catalogue, lookup=self._lookup
                    )
                except CatalogueError as exc:
                    raise JudgeError(str(exc)) from None
            return self._served

    def _forget(self, served: ServedModel) -> None:
        with self._lock:
            if self._served is served:
                self._served = None


def make_judges(names: dict[str, str], *, catalogue: Path, hook: JudgeHook) -> dict[str, TurnJudge]:
    """One scorer per judge name, shared by the arms that name it."""
    judges = {name: TurnJudge(name, catalogue=catalogue, hook=hook) for name in set(names.values())}
    return {arm: judges[name] for arm, name in names.items()}
