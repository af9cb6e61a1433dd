"""From resolved settings to the session's campaign: experiments loaded, refusals checked,
item specs built, the recorder and the per-arm runs made. Nothing starts here."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_haico.campaign import checks
from pytest_haico.config.experiment import Experiments, load_experiments
from pytest_haico.config.identity import source_tree
from pytest_haico.config.items import build_item_specs
from pytest_haico.config.settings import Settings
from pytest_haico.config.slurm import SlurmJob
from pytest_haico.errors import ConfigError, StackError

if TYPE_CHECKING:
    from pytest_haico.campaign.hooks import CampaignPlugin
    from pytest_haico.runner.judges import TurnJudge
    from pytest_haico.stack.kept import KeptState


def build_campaign(config: pytest.Config, settings: Settings) -> CampaignPlugin:
    """The campaign of `settings.experiments`; every refusal is a `pytest.UsageError`."""
    try:
        job = SlurmJob.from_environ(os.environ)
        experiments = load_experiments(settings.experiments)
        kept = None
        if settings.attach is not None:
            kept = _kept_stack(settings.attach)
            checks.check_attach(settings, kept, experiments.arms)
            settings = dataclasses.replace(settings, arms=(kept.arm,))
        checks.check_selection(settings, experiments.arms.keys(), experiments.strata)
        checks.check_shard_given(settings, job.in_array)
        checks.check_xdist(config, settings.experiments)
        checks.check_not_empty(
            config, settings.experiments, bool(experiments.arms), bool(experiments.scripts)
        )
        site_image = settings.site.get("BACKEND_IMAGE") if settings.site else None
        tree = source_tree(settings.backend_cmd_dir) if settings.backend_cmd else None
        specs = build_item_specs(experiments, settings, site_image=site_image, backend_tree=tree)
        if settings.items is not None:
            settings.items.check_known((spec.test_id for spec in specs), settings.experiments)
        judges = _judges(config, settings, experiments)
    except ConfigError as exc:
        raise pytest.UsageError(f"haico: {exc}") from None
    # The ledger's and the runner's modules load once the campaign passed its checks.
    from pytest_haico.campaign.hooks import CampaignPlugin
    from pytest_haico.campaign.job_exit import RUN_ITEMS_ENV
    from pytest_haico.ledger.recorder import Recorder
    from pytest_haico.runner.arm_runs import ArmRuns

    for tag in sorted(experiments.tags):
        config.addinivalue_line("markers", f"{tag}: script tag (pytest-haico)")
    recorder = Recorder(
        campaign_dir=settings.results / settings.campaign,
        campaign=settings.campaign,
        job=job,
        max_attempts=settings.max_attempts,
        shard=settings.shard,
        item_list=settings.items,
        file_mode=settings.results_mode,
    )
    campaign = CampaignPlugin(
        settings,
        specs,
        recorder,
        ArmRuns(settings, experiments.arms, recorder, kept=kept, judges=judges),
        collects_experiments=checks.collects(config, settings.experiments),
        run_items=Path(os.environ[RUN_ITEMS_ENV]) if os.environ.get(RUN_ITEMS_ENV) else None,
    )
    if kept is not None:
        campaign.selection.notes.append(
            f"haico: attached to the kept stack of arm {kept.arm} (supervisor pid "
            f"{kept.supervisor_pid}, up since {kept.started_at}): only its items run"
        )
        if kept.campaign_dir != settings.results / settings.campaign:
            campaign.selection.notes.append(
                f"haico: the kept stack's logs and dumps are in {kept.campaign_dir}, this run's "
                f"results in {settings.results / settings.campaign}: pass --haico-campaign "
                f"{kept.campaign_dir.name} (and --haico-results {kept.campaign_dir.parent}) "
                "to keep them in one campaign"
            )
    note = tree.note() if tree is not None else None
    if note is not None:
        campaign.selection.notes.append(f"haico: {note}")
    return campaign


def _judges(
    config: pytest.Config, settings: Settings, experiments: Experiments
) -> dict[str, TurnJudge]:
    """Each selected arm's judge, when its scripts ask one (`runner.judges`)."""
    if not any(
        turn.expect and turn.expect.judge for s in experiments.scripts for turn in s.script.turns
    ):
        return {}
    from pytest_haico.runner.judges import check_judges, make_judges

    arms = [
        arm for name, arm in experiments.arms.items() if not settings.arms or name in settings.arms
    ]
    names = check_judges(arms, experiments.scripts, option=settings.judge)
    return make_judges(
        names, catalogue=settings.catalogue, hook=config.hook.pytest_haico_judge_turn
    )


def _kept_stack(path: Path) -> KeptState:
    """The state of the kept stack `path` names; one line of usage error otherwise."""
    from pytest_haico.stack.kept import read_state

    try:
        return read_state(path)
    except StackError as exc:
        raise pytest.UsageError(f"haico: --haico-attach {exc}") from None
