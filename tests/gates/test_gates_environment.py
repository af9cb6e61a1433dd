"""Static gates over the environment: prohibited variables, the login node, GPUs, one node."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_haico.config.experiment import Arm
from pytest_haico.gates.static import (
    check_login_node,
    check_one_node,
    check_parallel_width,
    check_prohibited_environment,
    count_visible_gpus,
)
from tests.gates.conftest import make_fake_scontrol

HOST = "gpu07"
ENDPOINT = "http://vllm.localhost/v1"
# No scontrol on this PATH: the gates' own expansion is used.
NO_SCONTROL = {"PATH": "/nonexistent"}
JOB = {**NO_SCONTROL, "SLURM_JOB_ID": "4242"}


def arm(tp: int = 1, dp: int = 1) -> Arm:
    vllm = {"tensor_parallel_size": tp, "data_parallel_size": dp}
    return Arm.model_validate({"name": "demo", "vllm": vllm})


# --- gate 2: prohibited environment ---


def test_prohibited_environment_passes_without_openai_endpoint_url() -> None:
    result = check_prohibited_environment({"OPENAI_API_KEY": "x"}, ENDPOINT)
    assert result.passed, result
    assert result.detail == "OPENAI_ENDPOINT_URL unset; model endpoint host 'vllm.localhost'"


def test_openai_endpoint_url_fails_naming_it_and_hiding_credentials() -> None:
    environ = {"OPENAI_ENDPOINT_URL": "https://user:hunter2@api.example.com/v1"}
    result = check_prohibited_environment(environ, ENDPOINT)
    assert not result.passed
    assert result.failure_line == (
        "gate prohibited_environment failed: OPENAI_ENDPOINT_URL is set "
        "('https://user:[REDACTED]@api.example.com/v1'): the backend would send the "
        "conversations to that endpoint instead of the arm's vLLM; unset it "
        "(`unset OPENAI_ENDPOINT_URL`, and remove it from the job script, ~/.bashrc or the "
        "module that sets it), then rerun"
    )


def test_a_model_endpoint_whose_host_lacks_vllm_fails() -> None:
    result = check_prohibited_environment({}, "http://127.0.0.1:8000/v1")
    assert not result.passed
    assert "has host '127.0.0.1', which does not contain 'vllm'" in result.detail
    assert "--haico-model-endpoint" in result.fix


# --- gate 3: login node ---


def test_the_login_node_gate_is_off_for_the_local_profile() -> None:
    result = check_login_node({}, cluster=False, hostname=HOST)
    assert result.passed
    assert result.detail == "local profile: no Slurm node check"


def test_a_node_of_the_job_passes() -> None:
    environ = {**JOB, "SLURM_JOB_NODELIST": "gpu[05-08]"}
    result = check_login_node(environ, cluster=True, hostname=f"{HOST}.cluster.example")
    assert result.passed, result
    assert result.detail == "this host is a node of Slurm job 4242 (gpu[05-08])"


def test_an_salloc_shell_on_the_login_node_fails() -> None:
    environ = {**JOB, "SLURM_JOB_NODELIST": "gpu[01-03]"}
    result = check_login_node(environ, cluster=True, hostname="login1")
    assert not result.passed
    assert result.failure_line == (
        "gate login_node failed: this host (login1) is not a node of Slurm job 4242 "
        "(gpu[01-03]): an salloc shell runs on the login node, where the stack must not "
        "start; run pytest on the allocated node: `sbatch sbatch/campaign.sbatch`, or inside "
        "the salloc shell `srun --pty --overlap bash` first (or `srun pytest ...`)"
    )


def test_outside_a_job_the_cluster_profile_fails() -> None:
    result = check_login_node(NO_SCONTROL, cluster=True, hostname="login1")
    assert not result.passed
    assert result.detail.startswith("not inside a Slurm job (SLURM_JOB_ID is unset)")
    assert "--haico-profile local" in result.fix


def test_a_job_without_a_node_list_or_with_a_garbled_one_fails() -> None:
    assert not check_login_node(JOB, cluster=True, hostname=HOST).passed
    garbled = check_login_node({**JOB, "SLURM_JOB_NODELIST": "gpu[1-x]"}, cluster=True)
    assert not garbled.passed
    assert garbled.detail.startswith("cannot read SLURM_JOB_NODELIST='gpu[1-x]'")


def test_scontrol_show_hostnames_is_asked_first(tmp_path: Path) -> None:
    # A list the gates' own expansion reads differently: the answer must be scontrol's.
    bin_dir = make_fake_scontrol(tmp_path / "bin", stdout=f"gpu01\n{HOST}\n")
    environ = {"PATH": str(bin_dir), "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02]"}
    assert check_login_node(environ, cluster=True, hostname=HOST).passed
    assert (bin_dir / "scontrol.args").read_text().split() == ["show", "hostnames", "gpu[01-02]"]


def test_slurmd_nodename_counts_as_this_host() -> None:
    environ = {**JOB, "SLURM_JOB_NODELIST": "n17", "SLURMD_NODENAME": "n17"}
    assert check_login_node(environ, cluster=True, hostname="n17-ib0.example").passed


# --- gate 5: parallel width vs devices ---


@pytest.mark.parametrize(
    ("value", "count"),
    [("0,1", 2), ("", 0), ("NoDevFiles", 0), ("GPU-8f3a-11aa,GPU-22bc", 2), ("0,-1,2", 1)],
)
def test_visible_gpus_are_counted_as_cuda_does(value: str, count: int) -> None:
    assert count_visible_gpus(value) == count


def test_as_many_visible_gpus_as_tp_times_dp_pass() -> None:
    result = check_parallel_width(arm(2, 2), {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, cluster=True)
    assert result.passed, result
    assert result.detail == "4 GPUs visible = TP 2 x DP 2"


def test_fewer_gpus_than_tp_times_dp_fail_with_the_gres_to_ask_for() -> None:
    result = check_parallel_width(arm(2), {"CUDA_VISIBLE_DEVICES": "3"}, cluster=True)
    assert not result.passed
    assert result.failure_line == (
        "gate parallel_width failed: this job may use 1 GPU (CUDA_VISIBLE_DEVICES='3') but arm "
        "demo needs tensor_parallel_size 2 x data_parallel_size 1 = 2; ask Slurm for 2 GPUs "
        '([slurm] gres = "gpu:2" in arms/demo.toml, or --gres=gpu:2), or change [vllm] '
        "tensor_parallel_size / data_parallel_size"
    )


def test_unset_cuda_visible_devices_fails_on_the_cluster_only() -> None:
    result = check_parallel_width(arm(), {}, cluster=True)
    assert not result.passed
    assert result.detail.startswith("CUDA_VISIBLE_DEVICES is unset: this job was given no GPUs")
    assert check_parallel_width(arm(), {}, cluster=False).passed
    assert check_parallel_width(arm(), {}, cluster=True, starts_vllm=False).passed


# --- gate 6: one node ---


def test_one_node_passes() -> None:
    assert check_one_node({"SLURM_JOB_NUM_NODES": "1"}, cluster=True).passed
    assert check_one_node({"SLURM_NNODES": "1"}, cluster=True).passed
    by_list = check_one_node({**NO_SCONTROL, "SLURM_JOB_NODELIST": "gpu07"}, cluster=True)
    assert by_list.passed, by_list
    assert check_one_node({}, cluster=False).passed


def test_two_nodes_fail() -> None:
    result = check_one_node({"SLURM_JOB_NUM_NODES": "2"}, cluster=True)
    assert result.failure_line == (
        "gate one_node failed: the job has 2 nodes (SLURM_JOB_NUM_NODES), not one; submit with "
        "--nodes=1 (everything of a run lives on one node's 127.0.0.1)"
    )
    by_list = check_one_node({**NO_SCONTROL, "SLURM_JOB_NODELIST": "gpu[01-02]"}, cluster=True)
    assert not by_list.passed
    assert by_list.detail == "the job has 2 nodes (gpu[01-02]), not one"
    assert not check_one_node(NO_SCONTROL, cluster=True).passed
