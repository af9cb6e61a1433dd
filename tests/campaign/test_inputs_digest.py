"""The digest of a submission's frozen inputs: the same for a copy anywhere, changed by any
edit, blind to what Python and pytest write, strict about what is not a file."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from pytest_haico.config.frozen import inputs_digest, is_digest
from pytest_haico.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def experiments(root: Path, files: dict[str, bytes] | None = None) -> Path:
    """An experiments directory under `root` holding `files` (relative path -> bytes)."""
    files = (
        {
            "arms/demo.toml": b'description = "demo"\n',
            "scripts/a.yaml": b"id: a\nturns:\n  - user: hi\n",
            "test_conversations.py": b"def test_conversation(haico_conversation): pass\n",
        }
        if files is None
        else files
    )
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def test_the_digest_is_sha256_and_64_hex_digits(tmp_path: Path) -> None:
    digest = inputs_digest(experiments(tmp_path / "e"), None)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    assert is_digest(digest)
    assert not is_digest(digest.upper()) and not is_digest(digest[:-1]) and not is_digest("")


def test_a_copy_elsewhere_digests_as_its_original_whatever_its_mtimes_and_modes(
    tmp_path: Path,
) -> None:
    original = experiments(tmp_path / "project" / "experiments")
    site = tmp_path / "project" / "site.env"
    site.write_text("CLUSTER_WORK=/work\n")
    copy = tmp_path / "submissions" / "abc" / "experiments"
    shutil.copytree(original, copy)
    frozen_site = tmp_path / "submissions" / "abc" / "cluster.env"
    shutil.copyfile(site, frozen_site)
    for path in [*copy.rglob("*"), frozen_site]:
        os.utime(path, (0, 0))
        if path.is_file():
            path.chmod(0o444)  # haico submit makes its copy read-only
    assert inputs_digest(copy, frozen_site) == inputs_digest(original, site)


def test_the_demo_experiments_digest_as_their_copy(tmp_path: Path) -> None:
    copy = tmp_path / "experiments"
    shutil.copytree(REPO / "experiments", copy)
    assert inputs_digest(copy, None) == inputs_digest(REPO / "experiments", None)


def test_files_are_taken_in_path_order_not_in_the_order_they_were_made(tmp_path: Path) -> None:
    files = {"b.yaml": b"b", "a/z.yaml": b"z", "a.yaml": b"a", "a/b/c.toml": b"c"}
    forward = experiments(tmp_path / "one", files)
    backward = experiments(tmp_path / "two", dict(reversed(files.items())))
    assert inputs_digest(forward, None) == inputs_digest(backward, None)


@pytest.mark.parametrize(
    "edit",
    [
        "one byte of a script",
        "a file renamed",
        "a file added",
        "a file removed",
        "an empty file added",
        "bytes moved from a name to its content",
    ],
)
def test_any_edit_changes_the_digest(tmp_path: Path, edit: str) -> None:
    root = experiments(tmp_path / "e", {"scripts/ab": b"c", "arms/demo.toml": b"x = 1\n"})
    before = inputs_digest(root, None)
    script = root / "scripts" / "ab"
    if edit == "one byte of a script":
        script.write_bytes(b"d")
    elif edit == "a file renamed":
        script.rename(root / "scripts" / "ac")
    elif edit == "a file added":
        (root / "scripts" / "new.yaml").write_bytes(b"id: new\n")
    elif edit == "a file removed":
        (root / "arms" / "demo.toml").unlink()
    elif edit == "an empty file added":
        (root / "scripts" / "empty").write_bytes(b"")
    else:  # "scripts/ab" holding "c" against "scripts/a" holding "bc"
        script.unlink()
        (root / "scripts" / "a").write_bytes(b"bc")
    assert inputs_digest(root, None) != before


def test_cluster_env_counts_by_its_bytes_and_none_differs_from_an_empty_one(
    tmp_path: Path,
) -> None:
    root = experiments(tmp_path / "e")
    site = tmp_path / "cluster.env"
    site.write_text("")
    without, empty = inputs_digest(root, None), inputs_digest(root, site)
    site.write_text("CLUSTER_WORK=/work\n")
    assert len({without, empty, inputs_digest(root, site)}) == 3
    # A cluster.env is digested under the name cluster.env, wherever it is and whatever
    # its file is called; a file of the experiments of that name is another input.
    renamed = tmp_path / "elsewhere" / "site.env"
    renamed.parent.mkdir()
    shutil.copyfile(site, renamed)
    assert inputs_digest(root, renamed) == inputs_digest(root, site)
    shutil.copyfile(site, root / "cluster.env")
    assert inputs_digest(root, None) != inputs_digest(root, site) != without


def test_what_python_and_pytest_write_is_left_out(tmp_path: Path) -> None:
    root = experiments(tmp_path / "e")
    before = inputs_digest(root, None)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "test_conversations.cpython-311-pytest-8.4.2.pyc").write_bytes(b"\0")
    (root / "scripts" / "__pycache__").mkdir()
    (root / ".pytest_cache" / "v").mkdir(parents=True)
    (root / ".pytest_cache" / "v" / "lastfailed").write_text("{}")
    (root / "helpers.pyc").write_bytes(b"\0")
    assert inputs_digest(root, None) == before


def test_symlinks_are_followed_to_files_and_directories(tmp_path: Path) -> None:
    shared = experiments(tmp_path / "shared", {"common.yaml": b"id: common\n", "x/y": b"y"})
    linked = experiments(tmp_path / "linked", {"arms/demo.toml": b"x = 1\n"})
    (linked / "scripts").mkdir()
    (linked / "scripts" / "common.yaml").symlink_to(shared / "common.yaml")
    (linked / "more").symlink_to(shared / "x")
    plain = experiments(
        tmp_path / "plain",
        {"arms/demo.toml": b"x = 1\n", "scripts/common.yaml": b"id: common\n", "more/y": b"y"},
    )
    assert inputs_digest(linked, None) == inputs_digest(plain, None)
    # What `haico submit`'s copy (shutil.copytree, which follows symlinks) holds.
    copy = tmp_path / "copy"
    shutil.copytree(linked, copy)
    assert inputs_digest(copy, None) == inputs_digest(linked, None)


def test_a_dangling_symlink_is_an_error_naming_it(tmp_path: Path) -> None:
    root = experiments(tmp_path / "e")
    (root / "scripts" / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")
    with pytest.raises(ConfigError) as error:
        inputs_digest(root, None)
    assert str(error.value) == (
        f"{root}/scripts/gone.yaml: is a dangling symlink: restore its target or remove it"
    )


def test_a_special_file_is_an_error_naming_it(tmp_path: Path) -> None:
    root = experiments(tmp_path / "e")
    os.mkfifo(root / "scripts" / "pipe")
    with pytest.raises(ConfigError, match=re.escape(f"{root}/scripts/pipe: is neither a file")):
        inputs_digest(root, None)


def test_a_symlink_loop_is_an_error_naming_it(tmp_path: Path) -> None:
    root = experiments(tmp_path / "e")
    (root / "scripts" / "again").symlink_to(root)
    with pytest.raises(ConfigError, match=re.escape(f"{root}/scripts/again: is a symlink to")):
        inputs_digest(root, None)


def test_a_missing_directory_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'none'}: cannot be read")):
        inputs_digest(tmp_path / "none", None)
