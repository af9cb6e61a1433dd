"""`haico env` on the login node: bad input is one line and exit 2 before any job; what is in
place is said and not submitted; the job's sbatch line carries no credential."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pytest_haico.cli.main import main
from tests.site.env_site import TOKEN, EnvSite, make_env_site


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EnvSite:
    made = make_env_site(tmp_path)
    monkeypatch.chdir(tmp_path)
    # No sbatch on PATH: a command that submitted would fail with exit 2.
    monkeypatch.setenv("PATH", str(made.bin_dir))
    return made


def _env(site: EnvSite, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["env", "--experiments", str(site.experiments), *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_token_file_others_may_read_is_refused_in_one_line(
    site: EnvSite, capsys: pytest.CaptureFixture[str]
) -> None:
    site.token_file.chmod(0o640)
    status, out, err = _env(site, capsys, "--dry-run")
    assert (status, err) == (
        2,
        f"haico: REGISTRY_TOKEN_FILE: {site.token_file} is open to its group or others "
        f"(mode 0640): chmod 600 {site.token_file}\n",
    )
    assert TOKEN not in out + err


def test_a_token_file_behind_a_symlink_is_refused(
    site: EnvSite, capsys: pytest.CaptureFixture[str]
) -> None:
    real = site.token_file.with_name("elsewhere")
    site.token_file.rename(real)
    site.token_file.symlink_to(real)
    status, _, err = _env(site, capsys, "--dry-run")
    assert (status, err) == (
        2,
        f"haico: REGISTRY_TOKEN_FILE: {site.token_file} is a symbolic link\n",
    )


@pytest.mark.parametrize(
    ("lock", "says"),
    [
        (None, "VLLM_REQUIREMENTS={lock}: cannot read it (No such file or directory); point it "
               "at the pinned requirements file in cluster.env"),
        ("vllm>=0.8\n", "{lock}:1: 'vllm>=0.8' is not pinned (name==version): VLLM_REQUIREMENTS "
                        "is installed as a lock, without resolving; generate it with `pip "
                        "freeze` or `pip-compile`"),
        ("# pinned\ntorch==2.13.0\n-r more.txt\n", "{lock}:3: -r includes another file, which "
                                                   "the lock's digest would not cover: write its "
                                                   "lines into this file"),
    ],
)  # fmt: skip
def test_a_missing_requirements_file_or_one_that_is_no_lock_is_refused_in_one_line(
    site: EnvSite, capsys: pytest.CaptureFixture[str], lock: str | None, says: str
) -> None:
    if lock is None:
        site.lock.unlink()
    else:
        site.lock.write_text(lock)
    status, _, err = _env(site, capsys, "--dry-run")
    assert (status, err) == (2, f"haico: {says.format(lock=site.lock)}\n")


def test_a_lock_with_hashes_options_and_continuation_lines_is_accepted(
    site: EnvSite, capsys: pytest.CaptureFixture[str]
) -> None:
    site.lock.write_text(
        "--find-links /opt/wheels\n"
        "torch==2.13.0+cpu ; platform_machine == 'x86_64' \\\n"
        "    --hash=sha256:" + "0" * 64 + "\n"
        "numpy[extra]===2.1.0  # pinned exactly\n"
    )
    status, out, _ = _env(site, capsys, "--dry-run", "--venv-only")
    assert status == 0
    assert out.startswith(f"haico env: would submit (it builds VLLM_VENV={site.venv} from ")


def test_an_unknown_arm_is_refused_in_one_line(
    site: EnvSite, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = _env(site, capsys, "--dry-run", "--arm", "qwen")
    assert (status, err) == (
        2,
        f"haico: no arm 'qwen' in {site.experiments / 'arms'} (arms: demo)\n",
    )


def test_a_venv_directory_env_did_not_build_is_never_replaced(
    site: EnvSite, capsys: pytest.CaptureFixture[str]
) -> None:
    site.venv.mkdir()
    (site.venv / "someone-elses-work").write_text("keep me")
    status, _, err = _env(site, capsys, "--dry-run")
    assert (status, err) == (
        2,
        f"haico: VLLM_VENV={site.venv} exists and was not built by `haico env`: move it "
        "away, or point VLLM_VENV at a new directory\n",
    )
    assert (site.venv / "someone-elses-work").read_text() == "keep me"


def test_unset_venv_or_requirements_are_named_with_the_file(
    site: EnvSite, capsys: pytest.CaptureFixture[str]
) -> None:
    site.write_cluster_env(f"CLUSTER_WORK={site.work}", "VLLM_VENV=$CLUSTER_WORK/vllm-venv")
    status, _, err = _env(site, capsys, "--dry-run")
    assert (status, err) == (
        2,
        f"haico: {site.cluster_env}: VLLM_REQUIREMENTS is not set: name the pinned "
        "requirements file to build VLLM_VENV from\n",
    )


def test_the_dry_run_prints_one_job_on_the_cpu_partition_without_any_credential(
    site: EnvSite, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APPTAINER_DOCKER_PASSWORD", TOKEN)
    status, out, err = _env(site, capsys, "--dry-run")
    assert (status, err) == (0, "")
    [line] = out.splitlines()
    logs = site.work / "haico-env"
    assert line.startswith(
        f"haico env: would submit (it builds VLLM_VENV={site.venv} from vllm-lock.txt and "
        f"pulls 2 images into {site.sif_dir}): sbatch --parsable --job-name=haico-env "
        f"--nodes=1 --time=1:00:00 --chdir={logs} --output={logs}/env-%j.out "
        "--export=ALL,HAICO_PYTHON="
    )
    assert " --partition=debug " in line
    assert TOKEN not in line and "APPTAINER_DOCKER" not in line
    assert not logs.exists()  # a dry run writes nothing


def test_with_the_venv_built_and_the_images_pulled_nothing_is_submitted(
    site: EnvSite, capsys: pytest.CaptureFixture[str]
) -> None:
    site.mark_venv_built()
    site.sif_dir.mkdir()
    for sif in site.sifs():
        sif.write_text("{}")
    status, out, err = _env(site, capsys)
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"haico env: {site.venv} is up to date: vllm 0.0.1 from {site.lock} (sha256 "
        f"{_digest(site.lock)[:12]})",
        *(f"haico env: {sif} is already pulled" for sif in site.sifs()),
        "haico env: nothing to do: the venv and the images are in place",
    ]
    status, out, _ = _env(site, capsys, "--venv-only")
    assert (status, out.splitlines()[-1]) == (0, "haico env: nothing to do: the venv is in place")


def test_a_changed_lock_makes_the_venv_due_again(
    site: EnvSite, capsys: pytest.CaptureFixture[str]
) -> None:
    site.mark_venv_built()
    site.lock.write_text(site.lock.read_text() + "# a new pin\n")
    status, out, _ = _env(site, capsys, "--dry-run", "--venv-only")
    assert status == 0
    assert out.startswith(f"haico env: would submit (it builds VLLM_VENV={site.venv} from ")


def test_a_sif_of_another_user_is_refused_not_taken_as_pulled(
    site: EnvSite, capsys: pytest.CaptureFixture[str]
) -> None:
    site.mark_venv_built()
    site.sif_dir.mkdir()
    planted = site.sifs()[0]
    planted.write_text("{}")
    planted.chmod(0o666)
    status, _, err = _env(site, capsys, "--dry-run")
    assert (status, err) == (
        2,
        f"haico: {planted} is writable by group and others (mode 0666): remove it, or point "
        "SIF_DIR elsewhere\n",
    )


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
