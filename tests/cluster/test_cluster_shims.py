"""The shims refuse what the real programs (or pytest-haico's rules) refuse, and the Apptainer
shim gives a command exactly the environment `--cleanenv` plus the env file give."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pytest_haico.stack.service import write_env_file
from tests.cluster.shim_site import BACKEND_DIGEST, HOST_ONLY, ShimSite


def _run(argv: list[str], site: ShimSite) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=site.environ, capture_output=True, text=True, timeout=60, check=False
    )


def _vllm(site: ShimSite, *args: str) -> subprocess.CompletedProcess[str]:
    return _run([str(site.venv / "bin" / "vllm"), *args], site)


def _apptainer(site: ShimSite, *args: str) -> subprocess.CompletedProcess[str]:
    return _run([str(site.bin_dir / "apptainer"), *args], site)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["serve", "/m", "--not-a-vllm-flag"], "unrecognized arguments: --not-a-vllm-flag"),
        (["serve", "/m", "--api-key", "secret"], "--api-key in argv"),
        (["serve", "/m", "--enable-auto-tool-choice"], "requires --tool-call-parser"),
        (["serv", "/m"], "invalid choice: 'serv'"),
    ],
)
def test_the_vllm_shim_refuses_what_vllm_refuses_with_status_2(
    shim_site: ShimSite, args: list[str], says: str
) -> None:
    done = _vllm(shim_site, *args)
    assert done.returncode == 2
    assert says in done.stderr


def _sif(site: ShimSite, **content: object) -> Path:
    path = site.root / "test.sif"
    path.write_text(json.dumps({"fake_sif": 1, **content}))
    return path


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "x.sif"], "only `apptainer exec` and `pull` are supported"),
        (["exec", "--cleanenv", "--no-home", "--contain", "x.sif", "env"],
         "unknown flag: --contain"),
        (["exec", "--no-home", "x.sif", "env"], "must pass --cleanenv and --no-home"),
        (["exec", "--cleanenv", "x.sif", "env"], "must pass --cleanenv and --no-home"),
        (["exec", "--cleanenv", "--no-home", "--bind", "/nonexistent", "x.sif", "env"],
         "bind source /nonexistent does not exist"),
    ],
)  # fmt: skip
def test_the_apptainer_shim_accepts_only_the_flags_pytest_haico_uses(
    shim_site: ShimSite, args: list[str], says: str
) -> None:
    done = _apptainer(shim_site, *args)
    assert done.returncode == 255
    assert says in done.stderr


def test_the_backend_image_needs_its_hosts_file_bound_and_mapping_the_model_name(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    sif = str(shim_site.sif_dir / f"haico-backend-sha256-{BACKEND_DIGEST}.sif")
    done = _apptainer(shim_site, "exec", "--cleanenv", "--no-home", sif, "haico-backend")
    assert done.returncode == 255
    assert "this image needs a bind to /etc/hosts" in done.stderr
    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.7 vllm.localhost vllm\n")
    bind = f"{hosts}:/etc/hosts:ro"
    done = _apptainer(
        shim_site, "exec", "--cleanenv", "--no-home", "--bind", bind, sif, "haico-backend"
    )
    assert done.returncode == 255
    assert "maps vllm.localhost to 10.0.0.7" in done.stderr


def test_a_command_gets_the_image_env_apptainerenv_and_the_env_file_and_nothing_else(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    sif = _sif(shim_site, programs={"env": ["/usr/bin/env"]}, env={"PATH": "/bin", "X": "image"})
    env_file = tmp_path / "service.env"
    write_env_file(env_file, {"X": "file", "TOKEN": "a 'quoted' $value"})
    done = _apptainer(
        shim_site, "exec", "--cleanenv", "--no-home", "--env-file", str(env_file), str(sif), "env"
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == sorted(
        [
            "PATH=/bin",
            "X=file",
            "TOKEN=a 'quoted' $value",
            f"OPENAI_API_KEY={HOST_ONLY['APPTAINERENV_OPENAI_API_KEY']}",  # as Apptainer does
        ]
    )
    unknown = _apptainer(shim_site, "exec", "--cleanenv", "--no-home", str(sif), "bash")
    assert unknown.returncode == 255
    assert '"bash": executable file not found in $PATH' in unknown.stderr
