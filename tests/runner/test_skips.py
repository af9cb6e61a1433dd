"""The runner queues only items pytest will run: it reads skip marks as pytest does."""

from __future__ import annotations

import pytest

from pytest_haico.runner.skips import is_skipped_by_marks

MODULE = """
import pytest

FLAG = True


@pytest.mark.skip(reason="r")
def test_skip(): pass

@pytest.mark.skipif(True, reason="r")
def test_skipif_true(): pass

@pytest.mark.skipif(False, reason="r")
def test_skipif_false(): pass

@pytest.mark.skipif("FLAG and sys.platform != 'no-such-platform'")
def test_skipif_string_with_module_globals(): pass

@pytest.mark.skipif(False)
def test_skipif_bool_without_reason_errors(): pass

@pytest.mark.skipif("no_such_name")
def test_skipif_unevaluable_errors(): pass

@pytest.mark.xfail(run=False, reason="r")
def test_xfail_not_run(): pass

@pytest.mark.xfail(reason="r")
def test_xfail_run(): pass

@pytest.mark.xfail(False, run=False, reason="r")
def test_xfail_condition_false(): pass

def test_plain(): pass
"""
SKIPPED = {
    "test_skip",
    "test_skipif_true",
    "test_skipif_string_with_module_globals",
    "test_skipif_bool_without_reason_errors",
    "test_skipif_unevaluable_errors",
    "test_xfail_not_run",
}


@pytest.fixture(autouse=True)
def _loop_scope(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
    )


def predicted(pytester: pytest.Pytester) -> set[str]:
    return {item.name for item in pytester.getitems(MODULE) if is_skipped_by_marks(item)}


def test_skip_skipif_and_xfail_run_false_are_known_before_the_run(
    pytester: pytest.Pytester,
) -> None:
    assert predicted(pytester) == SKIPPED
    # What pytest itself does with them: none of these reaches its body.
    pytester.makepyfile(MODULE)
    result = pytester.runpytest("-rA")
    result.assert_outcomes(passed=3, skipped=3, xfailed=1, xpassed=1, errors=2)


def test_runxfail_runs_xfail_run_false(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MODULE)
    items, _ = pytester.inline_genitems("--runxfail")
    assert {item.name for item in items if is_skipped_by_marks(item)} == SKIPPED - {
        "test_xfail_not_run"
    }


def test_without_the_skipping_plugin_nothing_is_skipped(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MODULE)
    items, _ = pytester.inline_genitems("-p", "no:skipping")
    assert not any(is_skipped_by_marks(item) for item in items)
