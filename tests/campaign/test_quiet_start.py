"""A run in a directory without a pytest.ini starts quietly: pytest-asyncio's fixture loop
scope is the function scope (its announced default) unless an ini file sets one."""

from __future__ import annotations

import pytest

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess

_PROBE = """
import pytest
import pytest_asyncio


@pytest_asyncio.fixture
async def value():
    return 1


@pytest.mark.asyncio
async def test_probe(value, pytestconfig):
    print("loop scope:", pytestconfig.getini("asyncio_default_fixture_loop_scope"))
"""


def test_no_ini_file_prints_no_loop_scope_warning(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_probe=_PROBE)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    output = "\n".join(result.outlines + result.errlines)
    assert "Warning" not in output
    assert "asyncio_default_fixture_loop_scope=function" in output  # pytest-asyncio's header
    result.stdout.fnmatch_lines(["*loop scope: function*"])


def test_an_ini_files_loop_scope_is_kept(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = module\n")
    pytester.makepyfile(test_probe=_PROBE)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*loop scope: module*"])
