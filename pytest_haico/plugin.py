"""pytest-haico's entry point: its options, its markers, and the registration of its plugin
objects. What each object does lives in `pytest_haico.campaign`."""

from __future__ import annotations

import pytest

from pytest_haico.config.settings import add_options, resolve_settings

CAMPAIGN_PLUGIN = "haico-campaign"
NO_CAMPAIGN_PLUGIN = "haico-no-campaign"
SIGNALS_PLUGIN = "haico-signals"
FIXTURES_PLUGIN = "haico-fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "haico_item(spec): a scripted conversation of the campaign (set by pytest-haico)"
    )
    config.addinivalue_line(
        "markers", "haico_arm(name): the arm whose stack haico_stack / haico_client give this test"
    )
    from pytest_haico import fixtures

    config.pluginmanager.register(fixtures, FIXTURES_PLUGIN)
    settings = resolve_settings(config)
    from pytest_haico.campaign.checks import check_supported

    check_supported(settings)
    if not settings.experiments.is_dir():
        if settings.experiments_given:
            raise pytest.UsageError(
                f"haico: --haico-experiments {settings.experiments}: no such directory; it must "
                "hold arms/*.toml and scripts/*.yaml|*.jsonl"
            )
        config.pluginmanager.register(
            fixtures.NoCampaignPlugin(settings.experiments), NO_CAMPAIGN_PLUGIN
        )
        return
    # The campaign's modules load only when there is a campaign to run.
    from pytest_haico.campaign.setup import build_campaign
    from pytest_haico.runner.arm_runs import ARM_RUNS_KEY

    campaign = build_campaign(config, settings)
    config.stash[ARM_RUNS_KEY] = campaign.sessions
    config.pluginmanager.register(campaign, CAMPAIGN_PLUGIN)
    config.pluginmanager.register(campaign.signals, SIGNALS_PLUGIN)
    campaign.signals.install()
