"""Slurm host lists: scontrol's reading when it answers, else our own expansion."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_haico.slurm.hostlist import expand_hostlist, node_names
from tests.unit_slurm.commands import stand_ins


def test_hostlists_expand_like_scontrol() -> None:
    # What `scontrol show hostnames` printed for these on Slurm 22.05.
    assert expand_hostlist("node[01-03,07],gpu5,rack[1-2]-n[1-2]") == [
        "node01", "node02", "node03", "node07", "gpu5",
        "rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2",
    ]  # fmt: skip
    assert expand_hostlist("n[009-011],n[8-10]") == [
        "n009", "n010", "n011", "n8", "n9", "n10",
    ]  # fmt: skip


@pytest.mark.parametrize("text", ["a[1-x]", "n[3-1]", "n[1-3/2]", "n[1", "n]", "a,,b", ""])
def test_invalid_hostlists_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(text)


def test_scontrols_reading_is_the_answer(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, scontrol="echo gpu01; echo gpu07")
    assert node_names("gpu[01-02]", env) == ["gpu01", "gpu07"]
    assert (tmp_path / "scontrol.argv").read_text().split() == ["show", "hostnames", "gpu[01-02]"]


@pytest.mark.parametrize(
    "scontrol",
    [
        "exit 1",  # outside a job on a login node: no slurm.conf
        "echo 'scontrol: error: Invalid hostlist: gpu[06-07]' >&2",  # status 0, nothing said
    ],
    ids=["failing", "silent"],
)
def test_without_scontrols_reading_the_own_expansion_answers(tmp_path: Path, scontrol: str) -> None:
    env = stand_ins(tmp_path, scontrol=scontrol)
    assert node_names("gpu[06-07]", env) == ["gpu06", "gpu07"]
    assert node_names("gpu[06-07]", {"PATH": str(tmp_path / "nowhere")}) == ["gpu06", "gpu07"]
