"""Gates over files: the inputs are present (8); the results directory takes writes, fsyncs and
has room (9), on real file systems (a tiny tmpfs, full or read-only)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from pytest_haico.config.experiment import Arm
from pytest_haico.gates.filesystem import (
    check_inputs_present,
    check_node_tmpdir,
    check_results_writable,
    resolve_hf_cache,
)
from tests.fifos import plant_fifo, without_waiting
from tests.gates.conftest import Mount

COMMIT = "0123456789abcdef0123456789abcdef01234567"
RESULTS_FIX = (
    "use a writable file system with enough free space: --haico-results DIR (ini "
    "haico_results, env PYTEST_HAICO_RESULTS), or CLUSTER_WORK (results go to "
    "$CLUSTER_WORK/results)"
)


def path_arm(path: Path) -> Arm:
    return Arm.model_validate({"name": "demo", "model": {"path": str(path)}})


def hf_arm(revision: str | None = None) -> Arm:
    model = {"hf_id": "Qwen/Qwen2.5-7B-Instruct", "revision": revision}
    return Arm.model_validate({"name": "demo", "model": model})


def write_model(directory: Path, *, shards: int = 2, config: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if config:
        (directory / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {f"layer.{i}": name for i, name in enumerate(names)}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for name in names:
        (directory / name).write_bytes(b"\0")
    return directory


def write_hf_cache(cache: Path, *, ref: str | None = "main") -> Path:
    """`models--Qwen--Qwen2.5-7B-Instruct` as huggingface_hub lays it out: blobs, a snapshot
    of symlinks, refs/main."""
    repo = cache / "models--Qwen--Qwen2.5-7B-Instruct"
    blobs = write_model(repo / "blobs-src")
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in blobs.iterdir():
        blob = repo / "blobs" / f"sha-{file.name}"
        file.rename(blob)
        (snapshot / file.name).symlink_to(blob)
    blobs.rmdir()
    if ref is not None:
        (repo / "refs").mkdir()
        (repo / "refs" / ref).write_text(COMMIT)
    return cache


def scripts(tmp_path: Path) -> list[Path]:
    script = tmp_path / "scripts" / "a.yaml"
    script.parent.mkdir(exist_ok=True)
    script.write_text("id: a\nturns: [{user: hi}]\n")
    return [script]


# --- gate 8: inputs present ---


def test_a_model_directory_with_config_and_every_shard_passes(tmp_path: Path) -> None:
    model = write_model(tmp_path / "model")
    result = check_inputs_present(
        path_arm(model), needs_weights=True, hf_cache=tmp_path, scripts=scripts(tmp_path)
    )
    assert result.passed, result
    assert result.detail == (
        f"model {model}: config.json + model.safetensors.index.json (2 shards); "
        "1 script file readable"
    )


@pytest.mark.parametrize(
    ("breakage", "problem"),
    [
        ("no-config", "no config.json"),
        ("no-index", "no weights: neither model.safetensors.index.json or model.safetensors"),
        ("missing-shard", "model.safetensors.index.json lists shards that are missing: "),
        ("no-directory", "not a directory"),
    ],
)
def test_an_incomplete_model_directory_fails(tmp_path: Path, breakage: str, problem: str) -> None:
    model = write_model(tmp_path / "model", config=breakage != "no-config")
    if breakage == "no-index":
        for path in model.glob("model*"):
            path.unlink()
    elif breakage == "missing-shard":
        (model / "model-00002-of-00002.safetensors").unlink()
    elif breakage == "no-directory":
        model = tmp_path / "elsewhere"
    result = check_inputs_present(
        path_arm(model), needs_weights=True, hf_cache=tmp_path, scripts=scripts(tmp_path)
    )
    assert not result.passed
    assert result.detail.startswith(f"model directory {model} of arm demo: {problem}")
    assert result.fix.startswith("fix [model] path in arms/demo.toml")


def test_a_single_safetensors_file_is_a_complete_model(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0")
    result = check_inputs_present(
        path_arm(model), needs_weights=True, hf_cache=tmp_path, scripts=[]
    )
    assert result.passed, result


@pytest.mark.parametrize("revision", [None, "main", COMMIT])
def test_an_hf_id_resolves_in_the_local_cache(tmp_path: Path, revision: str | None) -> None:
    cache = write_hf_cache(tmp_path / "hub")
    result = check_inputs_present(
        hf_arm(revision), needs_weights=True, hf_cache=cache, scripts=scripts(tmp_path)
    )
    assert result.passed, result
    assert result.detail.startswith(
        f"Qwen/Qwen2.5-7B-Instruct@{revision or 'main'} in the HF cache"
        + ("" if revision else " (not pinned: set [model] revision)")
    )


def test_an_hf_id_missing_from_the_cache_fails_with_the_download_command(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    cache.mkdir()
    result = check_inputs_present(
        hf_arm("v1.0"), needs_weights=True, hf_cache=cache, scripts=scripts(tmp_path)
    )
    assert result.failure_line == (
        f"gate inputs_present failed: Qwen/Qwen2.5-7B-Instruct is not in the Hugging Face cache "
        f"{cache} (no models--Qwen--Qwen2.5-7B-Instruct); download it where there is network: "
        f"`HF_HUB_CACHE={cache} hf download Qwen/Qwen2.5-7B-Instruct --revision v1.0` (jobs "
        "read the cache offline, HF_HUB_OFFLINE=1), or fix HF_HOME in cluster.env"
    )


def test_an_unknown_revision_or_an_interrupted_download_fails(tmp_path: Path) -> None:
    cache = write_hf_cache(tmp_path / "hub")
    unknown = check_inputs_present(hf_arm("v2"), needs_weights=True, hf_cache=cache, scripts=[])
    assert not unknown.passed
    assert unknown.detail.startswith("revision 'v2' of Qwen/Qwen2.5-7B-Instruct is not in the")
    blob = cache / "models--Qwen--Qwen2.5-7B-Instruct/blobs/sha-model-00001-of-00002.safetensors"
    blob.unlink()  # the snapshot's symlink now dangles
    partial = check_inputs_present(hf_arm(), needs_weights=True, hf_cache=cache, scripts=[])
    assert not partial.passed
    assert "lists shards that are missing: model-00001-of-00002.safetensors" in partial.detail
    assert "(an interrupted download?)" in partial.detail


@pytest.mark.parametrize(
    ("planted", "problem"),
    [
        ("config.json", "config.json is unreadable or not JSON ("),
        ("model.safetensors.index.json", "model.safetensors.index.json is unreadable or has no"),
        ("model.safetensors", "model.safetensors is a FIFO, not a regular file"),
        ("refs/main", "revision 'main' of Qwen/Qwen2.5-7B-Instruct: "),
    ],
)
def test_a_fifo_in_a_shared_model_cache_fails_the_gate_without_waiting(
    tmp_path: Path, planted: str, problem: str
) -> None:
    """A FIFO where a model file belongs (another user's, in a shared cache) would hold the
    gate, and the allocation, until the walltime; it fails the gate at once instead."""
    cache = write_hf_cache(tmp_path / "hub")
    repo = cache / "models--Qwen--Qwen2.5-7B-Instruct"
    snapshot = repo / "snapshots" / COMMIT
    if planted == "model.safetensors":  # the single-file layout
        for path in snapshot.glob("model*"):
            path.unlink()
    fifo = plant_fifo(repo / planted if planted.startswith("refs/") else snapshot / planted)
    result = without_waiting(
        lambda: check_inputs_present(hf_arm(), needs_weights=True, hf_cache=cache, scripts=[]),
        fifo,
    )
    assert not result.passed
    assert problem in result.detail
    if planted in ("config.json", "refs/main"):
        assert "is a FIFO, not a regular file" in result.detail


def test_the_hf_cache_is_found_as_huggingface_hub_finds_it(tmp_path: Path) -> None:
    assert resolve_hf_cache({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}, "/site") == Path("/c")
    assert resolve_hf_cache({"HF_HOME": "/h"}, "/site") == Path("/site/hub")
    assert resolve_hf_cache({"HF_HOME": "/h"}) == Path("/h/hub")
    assert resolve_hf_cache({"HOME": "/home/u"}) == Path("/home/u/.cache/huggingface/hub")


def test_missing_scripts_and_images_fail_and_weights_only_when_needed(tmp_path: Path) -> None:
    arm = path_arm(tmp_path / "nowhere")
    assert check_inputs_present(arm, needs_weights=False, hf_cache=tmp_path, scripts=[]).passed
    gone = tmp_path / "gone.yaml"
    result = check_inputs_present(arm, needs_weights=False, hf_cache=tmp_path, scripts=[gone])
    assert result.detail == f"the script file {gone} does not exist"
    image = tmp_path / "backend.sif"
    result = check_inputs_present(
        arm, needs_weights=False, hf_cache=tmp_path, scripts=[], images=[image]
    )
    assert result.detail == f"the image {image} does not exist"
    assert result.fix.startswith("pull the images first with `haico env`")
    no_weights = Arm.model_validate({"name": "demo"})
    result = check_inputs_present(no_weights, needs_weights=True, hf_cache=tmp_path, scripts=[])
    assert result.detail == "arm demo names no weights: vLLM has nothing to load"


# --- gate node_tmpdir: the node-local TMPDIR ---


def test_a_writable_tmpdir_passes_and_keeps_no_probe(tmp_path: Path) -> None:
    result = check_node_tmpdir({"TMPDIR": str(tmp_path)})
    assert result.passed and result.detail == f"write + fsync in {tmp_path}", result
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_tmpdir_fails_instead_of_another_directory_taken_unasked(
    tmp_path: Path, tmpfs: Mount
) -> None:
    tmpdir = tmpfs(tmp_path / "ro", read_only=True)
    result = check_node_tmpdir({"TMPDIR": str(tmpdir)})
    assert not result.passed
    assert result.detail.startswith(f"cannot write to this node's TMPDIR {tmpdir}: Read-only")
    assert "haico continue` reruns the share on other nodes" in result.fix


# --- gate 9: results directory ---


def test_a_writable_results_directory_passes_and_is_made_with_the_mode(tmp_path: Path) -> None:
    results = tmp_path / "results" / "default"
    result = check_results_writable(results, bytes_needed=1024, file_mode=0o640)
    assert result.passed, result
    assert result.detail.startswith(f"write + fsync in {results}; ")
    assert result.detail.endswith(" free (1.0 KiB needed)")
    assert stat.S_IMODE(results.stat().st_mode) == 0o750
    assert list(results.iterdir()) == [], "the probe file was left behind"


def test_a_results_path_under_a_file_fails(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    results = tmp_path / "file" / "results"
    result = check_results_writable(results, bytes_needed=0, file_mode=0o640)
    assert not result.passed
    assert result.detail.startswith(f"cannot write to the results directory {results}: ")
    assert "[Errno 20] exists and is not a directory" in result.detail
    assert result.fix == RESULTS_FIX


def test_a_read_only_results_file_system_fails(tmp_path: Path, tmpfs: Mount) -> None:
    results = tmpfs(tmp_path / "ro", read_only=True)
    result = check_results_writable(results, bytes_needed=0, file_mode=0o640)
    assert not result.passed
    assert "[Errno 30] Read-only file system" in result.detail
    assert f"on the file system mounted at {results} (tmpfs from tmpfs, device " in result.detail


def test_a_full_results_file_system_fails_and_leaves_no_probe(tmp_path: Path, tmpfs: Mount) -> None:
    results = tmpfs(tmp_path / "full")
    filler = results / "filler.bin"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    result = check_results_writable(results, bytes_needed=0, file_mode=0o640)
    assert not result.passed
    assert "[Errno 28] No space left on device" in result.detail
    assert sorted(p.name for p in results.iterdir()) == ["filler.bin"]


def test_too_little_free_space_for_the_dumps_fails(tmp_path: Path, tmpfs: Mount) -> None:
    results = tmpfs(tmp_path / "small")
    result = check_results_writable(results, bytes_needed=1 << 30, file_mode=0o640)
    assert not result.passed
    assert result.detail == (
        f"64.0 KiB free on the file system mounted at {results} (tmpfs from tmpfs, device "
        f"{result.detail.split('device ')[1].split(')')[0]}), but the database dumps need "
        "1.0 GiB"
    )
    assert result.fix == f"free space there, or {RESULTS_FIX}"
