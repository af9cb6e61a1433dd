"""pytest-haico's entry point: its options, its markers, the registration of its plugin
objects, and the plugins a campaign does without. What each object does lives in
`pytest_haico.campaign`."""

from __future__ import annotations

import os
import shlex
from collections.abc import Generator
from types import ModuleType

import pytest

from pytest_haico.campaign.early_signals import hold_signals, take_held
from pytest_haico.config.options import add_options, describe_unknown_options

CAMPAIGN_PLUGIN = "haico-campaign"
NO_CAMPAIGN_PLUGIN = "haico-no-campaign"
SIGNALS_PLUGIN = "haico-signals"
FIXTURES_PLUGIN = "haico-fixtures"
HELD_PLUGINS = "haico-held-plugins"

# langsmith, which the stand-ins' LangChain pulls in, registers a pytest plugin (entry point
# `langsmith_plugin`) whose import costs about a second at every pytest start
# (benchmarks/static_gate.py); no campaign uses it.
LANGSMITH_PLUGIN = "langsmith_plugin"


class HeldPlugins:
    """Entry-point plugins held back while pytest loaded its entry points; a session that
    turns out not to be a campaign gets them at configure time (`release`)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def release(self, pluginmanager: pytest.PytestPluginManager) -> None:
        for name in self.names:
            pluginmanager.unblock(name)
            pluginmanager.load_setuptools_entrypoints("pytest11", name=name)
        self.names = []


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    config = pluginmanager.get_plugin("pytestconfig")
    if isinstance(config, pytest.Config):
        # First: from here until configure decides, a signal is held, not fatal.
        hold_signals(config)
    from pytest_haico import hookspecs

    pluginmanager.add_hookspecs(hookspecs)
    # pytest calls this as it registers this plugin, so before it imports the entry points
    # listed after ours (their order in site-packages: when langsmith's comes first, it has
    # loaded already). Whether this session is a campaign is known only at configure time,
    # so langsmith's plugin is held back now and released then for any other session.
    # What the user named (-p langsmith_plugin, -p no:langsmith_plugin) is left alone.
    if (
        not isinstance(config, pytest.Config)
        or pluginmanager.has_plugin(LANGSMITH_PLUGIN)
        or pluginmanager.is_blocked(LANGSMITH_PLUGIN)
        or _asks_for_langsmith_output(config)
    ):
        return
    pluginmanager.set_blocked(LANGSMITH_PLUGIN)
    pluginmanager.register(HeldPlugins([LANGSMITH_PLUGIN]), HELD_PLUGINS)


def _asks_for_langsmith_output(config: pytest.Config) -> bool:
    """Whether any argument pytest will parse is langsmith's own option, which only its
    plugin, loaded now, can parse."""
    args = [
        *config.invocation_params.args,
        *shlex.split(os.environ.get("PYTEST_ADDOPTS", "")),
        *config.getini("addopts"),
    ]
    return any(arg.startswith("--langsmith-output") for arg in args)


def _register_fixtures(config: pytest.Config) -> ModuleType:
    """Registers (and imports) the fixtures' module."""
    from pytest_haico import fixtures

    config.pluginmanager.register(fixtures, FIXTURES_PLUGIN)
    return fixtures


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(
    parser: pytest.Parser, args: list[str]
) -> Generator[None, None, None]:
    """pytest-asyncio's fixture loop scope defaults to "function", its announced default;
    a misspelled `--haico-*` option is refused with the nearest one.

    Unset, pytest-asyncio warns at every start; an ini file's value still wins. Every
    plugin's `pytest_addoption` has run by now, so this registration is the last.
    """
    parser.addini(
        "asyncio_default_fixture_loop_scope",
        type="string",
        help="default scope of the asyncio event loop used to execute async fixtures",
        default="function",
    )
    yield
    # The initial conftests' options are known now; pytest refuses an unknown word next,
    # with only "unrecognized arguments".
    _, unknown = parser.parse_known_and_unknown_args(args)
    message = describe_unknown_options(unknown)
    if message is not None:
        raise pytest.UsageError(message)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "haico_item(spec): a scripted conversation of the campaign (set by pytest-haico)"
    )
    config.addinivalue_line(
        "markers", "haico_arm(name): the arm whose stack haico_stack / haico_client give this test"
    )
    from pytest_haico.config.settings import ExitMode, resolve_settings

    settings = resolve_settings(config)
    from pytest_haico.campaign.checks import check_rootdir, check_supported, collects

    check_rootdir(config)
    check_supported(settings)
    campaign_dir = settings.experiments.is_dir()
    runs_campaign = campaign_dir and collects(config, settings.experiments)
    early = take_held(config)
    if early is not None and not runs_campaign:
        early.release()
    held = config.pluginmanager.get_plugin(HELD_PLUGINS)
    if isinstance(held, HeldPlugins) and not runs_campaign:
        held.release(config.pluginmanager)
    if not campaign_dir:
        if settings.experiments_given:
            raise pytest.UsageError(
                f"haico: --haico-experiments {settings.experiments}: no such directory; it must "
                "hold arms/*.toml and scripts/*.yaml|*.jsonl"
            )
        fixtures = _register_fixtures(config)
        config.pluginmanager.register(
            fixtures.NoCampaignPlugin(settings.experiments), NO_CAMPAIGN_PLUGIN
        )
        return
    strict = settings.exit_mode is ExitMode.STRICT
    if early is not None and runs_campaign and early.end_campaign(config, strict=strict):
        return
    # The campaign's modules load only when there is a campaign to run; the fixtures' (the
    # ledger, the runner) only once it passed its checks, so a usage error comes without them.
    from pytest_haico.campaign.setup import build_campaign

    campaign = build_campaign(config, settings)
    _register_fixtures(config)
    from pytest_haico.runner.arm_runs import ARM_RUNS_KEY

    config.stash[ARM_RUNS_KEY] = campaign.sessions
    config.pluginmanager.register(campaign, CAMPAIGN_PLUGIN)
    if campaign.sessions.judges:
        from pytest_haico.runner.judge_model import JUDGE_PLUGIN, JudgeModelPlugin

        config.pluginmanager.register(JudgeModelPlugin(), JUDGE_PLUGIN)
    config.pluginmanager.register(campaign.signals, SIGNALS_PLUGIN)
    if runs_campaign:
        # A run of other tests beside the campaign (this repository's own, a user's unit
        # tests) keeps the handlers it has: the campaign installs them only once its
        # collection shows a test that asks for it.
        campaign.signals.install(early)
        from pytest_haico.campaign.progress import ProgressPlugin

        # Registers itself as "haico-progress" when the output is a job log, not a terminal.
        ProgressPlugin.install(config, settings, campaign.sessions, campaign.recorder)
