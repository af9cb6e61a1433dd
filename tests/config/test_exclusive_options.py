"""Options that name two sources of one thing are refused together, in one line, before
anything starts: a model served from the catalogue, a model endpoint, a kept stack's model;
a backend image and a backend command."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (
            ["--haico-model=judge", "--haico-model-endpoint=http://127.0.0.1:9/v1"],
            "haico: --haico-model and --haico-model-endpoint exclude each other; give one",
        ),
        (
            ["--haico-model=judge", "--haico-attach=kept.json"],
            "haico: --haico-model and --haico-attach exclude each other: a kept stack serves "
            "its own model; give one",
        ),
        (
            ["--haico-backend-image=docker://b@sha256:" + "a" * 64, "--haico-backend-cmd=true"],
            "haico: --haico-backend-image and --haico-backend-cmd exclude each other; give one",
        ),
    ],
    ids=["model-and-endpoint", "model-and-attach", "image-and-command"],
)
def test_two_sources_of_one_thing_are_one_usage_error(
    pytester: pytest.Pytester, options: list[str], says: str
) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest(*options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.lines == [f"ERROR: {says}", ""]
