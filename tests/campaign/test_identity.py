"""item_id: what determines a result is in it; tags, stratum and repeat count are not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.config.experiment import Arm, Script
from pytest_haico.config.identity import (
    backend_identity,
    item_id,
    model_identity,
    parse_backend_identity,
    parse_model_identity,
    source_tree,
)
from pytest_haico.config.settings import Profile

SCRIPT: dict[str, Any] = {
    "id": "plan",
    "stratum": "default",
    "tags": ["smoke"],
    "repeats": 1,
    "turns": [{"user": "Plan a trip."}, {"user": "Write it up.", "expect": {"artifact": True}}],
}


def arm(**sections: object) -> Arm:
    return Arm.model_validate({"name": "demo", **sections})


def script(**changes: object) -> Script:
    return Script.model_validate({**SCRIPT, **changes})


def identity(a: Arm, s: Script, repeat: int = 0, *, model: str = "m", backend: str = "b") -> str:
    return item_id(a, s, repeat, model=model, backend=backend)


def test_retagging_restratifying_or_adding_repeats_keeps_the_id() -> None:
    base = identity(arm(), script())
    assert identity(arm(), script(tags=["demo", "long"])) == base
    assert identity(arm(), script(stratum="long", description="now longer")) == base
    assert identity(arm(), script(repeats=5)) == base
    assert identity(arm(description="another text"), script()) == base


def test_a_changed_turn_changes_the_id() -> None:
    base = identity(arm(), script())
    changed = [{"user": "Plan a trip."}, {"user": "Write it up."}]
    assert identity(arm(), script(turns=changed)) != base
    assert identity(arm(), script(turns=[{"user": "Plan a cruise."}, SCRIPT["turns"][1]])) != base


def test_the_repeat_index_is_in_the_id() -> None:
    assert identity(arm(), script(), 0) != identity(arm(), script(), 1)


def test_a_changed_arm_setting_changes_the_id() -> None:
    base = identity(arm(), script())
    assert identity(arm(generation={"temperature": 0.7}), script()) != base
    assert identity(arm(agent={"recursion_limit": 99}), script()) != base
    assert identity(arm(vllm={"extra_args": ["--enforce-eager"]}), script()) != base
    assert identity(arm(model={"served_name": "other"}), script()) != base


def test_new_weights_under_the_same_path_change_the_id(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 1}')
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    a = arm(model={"path": str(tmp_path)})
    before = model_identity(a, profile=Profile.CLUSTER)
    (tmp_path / "config.json").write_text('{"hidden_size": 2}')
    after = model_identity(a, profile=Profile.CLUSTER)
    assert before != after
    assert identity(a, script(), model=before) != identity(a, script(), model=after)


def test_a_new_backend_image_changes_the_id() -> None:
    a = arm()
    old = backend_identity(a, profile=Profile.CLUSTER, image="docker://haico@sha256:" + "1" * 64)
    new = backend_identity(a, profile=Profile.CLUSTER, image="docker://haico@sha256:" + "2" * 64)
    cmd = backend_identity(a, profile=Profile.CLUSTER, command="uv run haico-backend")
    assert len({old, new, cmd}) == 3
    assert identity(a, script(), backend=old) != identity(a, script(), backend=new)


def test_a_sif_rebuilt_at_the_same_path_is_another_backend(tmp_path: Path) -> None:
    sif = tmp_path / "haico-backend.sif"
    sif.write_bytes(b"SIF_MAGIC build 1" + bytes(100))
    first = backend_identity(arm(), profile=Profile.CLUSTER, image=str(sif))
    assert first == backend_identity(arm(), profile=Profile.CLUSTER, image=str(sif))
    copy = tmp_path / "copy" / "haico-backend.sif"
    copy.parent.mkdir()
    copy.write_bytes(sif.read_bytes())
    # A copy of the same build elsewhere has the same header.
    assert (
        first.split(";")[1]
        == backend_identity(arm(), profile=Profile.CLUSTER, image=str(copy)).split(";")[1]
    )
    sif.write_bytes(b"SIF_MAGIC build 2" + bytes(100))
    rebuilt = backend_identity(arm(), profile=Profile.CLUSTER, image=str(sif))
    assert rebuilt != first
    assert identity(arm(), script(), backend=rebuilt) != identity(arm(), script(), backend=first)


def test_an_arms_backend_image_names_the_backend_on_the_cluster_profile_only() -> None:
    image = "docker://haico@sha256:" + "3" * 64
    with_image = arm(backend={"image": image})
    assert backend_identity(with_image, profile=Profile.CLUSTER) == f"image:{image}"
    # The local profile runs its stand-in whatever the arm names for a cluster.
    assert backend_identity(with_image, profile=Profile.LOCAL) == backend_identity(
        arm(), profile=Profile.LOCAL
    )
    assert backend_identity(arm(), profile=Profile.LOCAL).startswith("standin:")


def test_hf_model_identity_records_an_unpinned_revision() -> None:
    pinned = arm(model={"hf_id": "Qwen/Qwen2.5-7B", "revision": "abc123"})
    unpinned = arm(model={"hf_id": "Qwen/Qwen2.5-7B"})
    assert model_identity(pinned, profile=Profile.CLUSTER) == "hf:Qwen/Qwen2.5-7B@abc123"
    assert model_identity(unpinned, profile=Profile.CLUSTER) == "hf:Qwen/Qwen2.5-7B@unpinned"


def _git(directory: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(directory), *args],
        check=True,
        capture_output=True,
        env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
             "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"},
    )  # fmt: skip


def _command_identity(directory: Path) -> str:
    tree = source_tree(directory)
    return backend_identity(arm(), profile=Profile.LOCAL, command="./serve {port}", tree=tree)


@pytest.mark.subprocess
def test_a_backend_commands_identity_is_its_trees_commit_and_changes(tmp_path: Path) -> None:
    repo = tmp_path / "backend"
    repo.mkdir()
    assert source_tree(repo).commit is None  # not a checkout yet
    assert "not a git checkout" in (source_tree(repo).note() or "")
    _git(repo, "init", "-q")
    (repo / "app.py").write_text("VERSION = 1\n")
    _git(repo, "add", "app.py")
    _git(repo, "commit", "-q", "-m", "one")
    clean = _command_identity(repo)
    assert clean.startswith("cmd:./serve {port};git:") and "dirty" not in clean
    assert source_tree(repo).note() is None
    assert _command_identity(repo) == clean  # the same build, the same identity

    (repo / "app.py").write_text("VERSION = 2\n")
    edit_2 = _command_identity(repo)
    (repo / "app.py").write_text("VERSION = 3\n")
    edit_3 = _command_identity(repo)
    assert len({clean, edit_2, edit_3}) == 3  # every edit of a tracked file is another build
    assert "dirty tree" in (source_tree(repo).note() or "")

    (repo / "app.py").write_text("VERSION = 1\n")
    (repo / "notes.txt").write_text("untracked\n")
    untracked = _command_identity(repo)
    assert untracked.endswith("+dirty:untracked-only")
    assert "untracked files share item ids" in (source_tree(repo).note() or "")


def test_scripts_without_the_new_expectation_keys_keep_their_ids() -> None:
    # Computed by the release whose only expectation was `artifact`: the keys added since
    # are left out of the projection while a script does not set them.
    assert identity(arm(), script()) == (
        "b06ab568d05ea4a009866844a92ac164e595d72afe7f690db6e0e366b961f770"
    )
    assert identity(arm(), script(turns=[{"user": "hi"}])) == (
        "a4ab2e2c38ea29888d4a147528843f456f0f8a61b8e823d59ccbd2456fbbd091"
    )


def test_each_new_expectation_key_is_part_of_the_id() -> None:
    base = identity(arm(), script())
    ids = {
        identity(arm(), script(turns=[{"user": "Plan a trip.", "expect": expect}]))
        for expect in (
            {"contains": "Crete"},
            {"contains": ["Crete"]},
            {"matches": "Crete"},
            {"tool_called": "write_document"},
            {"tool_not_called": "write_document"},
            {"no_tool_error": True},
            {"max_steps": 3},
        )
    }
    assert len(ids) == 7 and base not in ids


def test_a_judge_expectation_renames_only_the_items_that_use_it() -> None:
    judged = [{"user": "Plan a trip.", "expect": {"judge": "Is the plan for three days?"}}]
    base = identity(arm(), script())
    unjudged = identity(arm(), script(turns=[{"user": "Plan a trip."}]))
    assert identity(arm(), script(turns=judged)) not in {base, unjudged}
    asked_otherwise = [{"user": "Plan a trip.", "expect": {"judge": "Is it for Crete?"}}]
    assert identity(arm(), script(turns=judged)) != identity(arm(), script(turns=asked_otherwise))
    # The scripts that do not ask a judge keep the ids the release before it computed.
    assert base == "b06ab568d05ea4a009866844a92ac164e595d72afe7f690db6e0e366b961f770"


def test_which_judge_answers_is_not_part_of_the_id() -> None:
    judged = script(turns=[{"user": "Plan a trip.", "expect": {"judge": "Three days?"}}])
    assert identity(arm(run={"judge": "judge-a"}), judged) == identity(arm(), judged)
    assert identity(arm(run={"judge": "judge-b"}), judged) == identity(arm(), judged)


def test_identities_read_as_the_objects_the_ledger_records(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    (model_dir / "model.safetensors.index.json").write_text("{}")
    empty = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    by_path = model_identity(arm(model={"path": str(model_dir)}), profile=Profile.CLUSTER)
    assert parse_model_identity(by_path) == {
        "kind": "path",
        "path": str(model_dir),
        "config_sha256": empty,
        "shard_index": "model.safetensors.index.json",
        "shard_index_sha256": empty,
    }
    unpinned = model_identity(arm(model={"hf_id": "Qwen/Qwen2.5-7B"}), profile=Profile.CLUSTER)
    assert parse_model_identity(unpinned) == {
        "kind": "hf",
        "hf_id": "Qwen/Qwen2.5-7B",
        "revision": None,
    }
    endpoint = model_identity(arm(), profile=Profile.LOCAL, endpoint="http://vllm.localhost:1/v1")
    assert parse_model_identity(endpoint) == {
        "kind": "endpoint",
        "endpoint": "http://vllm.localhost:1/v1",
        "served_name": "demo",
    }
    assert parse_model_identity(model_identity(arm(), profile=Profile.LOCAL))["kind"] == "standin"
    image = "docker://haico@sha256:" + "1" * 64
    assert parse_backend_identity(
        backend_identity(arm(), profile=Profile.CLUSTER, image=image)
    ) == {"kind": "image", "image": image, "header_sha256": None}
    assert parse_backend_identity(
        backend_identity(arm(), profile=Profile.LOCAL, command="./serve {port}; echo")
    ) == {
        "kind": "cmd",
        "command": "./serve {port}; echo",
        "git_commit": None,
        "git_dirty": False,
        "git_diff_sha256": None,
    }
    assert parse_model_identity("m") == {"kind": "unknown", "text": "m"}
