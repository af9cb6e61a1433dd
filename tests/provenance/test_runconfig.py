"""run-config.env and run-config.json: every knob and version of a run, sourceable, secret-free."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pytest_haico import __version__
from pytest_haico.provenance.model_server import parse_metrics, server_identity, startup_values
from pytest_haico.provenance.runconfig import RunConfig
from pytest_haico.redact import Redactor
from tests.harness import CampaignProject

# A hand-written test after the items hands the run's secrets to this test, outside results/.
SECRETS_OUT = """
import os
from pathlib import Path


def test_zz_secrets(haico_stack):
    password = haico_stack.readonly_dsn.split(":", 2)[2].split("@", 1)[0]
    Path(os.environ["HAICO_TEST_SECRETS"]).write_text(
        "\\n".join([haico_stack.admin_token, password])
    )
"""


@pytest.mark.subprocess
def test_a_run_records_its_knobs_versions_and_ports_and_no_secret(
    campaign: CampaignProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign.arm("demo", "[run]\nconcurrency = 2\n")
    campaign.simple_scripts("s1", "s2")
    campaign.write("test_conversations.py", "def test_c(haico_conversation):\n    pass\n")
    campaign.write("test_zz_secrets.py", SECRETS_OUT)
    secrets_file = tmp_path / "secrets.txt"
    monkeypatch.setenv("HAICO_TEST_SECRETS", str(secrets_file))
    result = campaign.run_subprocess("--haico-dump-interval", "0")
    assert result.ret == 0, result.stdout.str()
    (run,) = (campaign.arm_dir("demo") / "runs").iterdir()
    env_file, json_file = run / "run-config.env", run / "run-config.json"
    assert env_file.stat().st_mode & 0o777 == 0o640
    echo = 'echo "$POSTGRES_PORT $VLLM_PORT $BACKEND_PORT $OPTION_DUMP_INTERVAL"'
    echo += ' "$ARM_RUN_CONCURRENCY"'
    sourced = subprocess.run(
        ["bash", "-c", f"set -eu; source {env_file}; {echo}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    values = json.loads(json_file.read_text())["values"]
    assert sourced == [
        values["POSTGRES_PORT"], values["VLLM_PORT"], values["BACKEND_PORT"], "0.0", "2"
    ]  # fmt: skip
    assert all(port.isdigit() for port in sourced[:3])
    for key in ("HARNESS_VERSION", "PYTHON_VERSION", "POSTGRES_VERSION", "MODEL_SERVER",
                "MODEL_SERVER_VERSION", "STANDIN_VLLM_VERSION", "MODEL_IDENTITY",
                "BACKEND_IDENTITY", "EXPERIMENTS_GIT_COMMIT", "NODE",
                "OPTION_DUMP_INTERVAL_SOURCE"):  # fmt: skip
        assert values.get(key), key
    # The local profile's stand-in served the run, and says so: no vLLM ran.
    assert (values["MODEL_SERVER"], values["MODEL_SERVER_VERSION"]) == ("standin", __version__)
    assert "VLLM_VERSION" not in values and "VLLM_NON_DEFAULT_ARGS" not in values
    assert values["OPTION_DUMP_INTERVAL_SOURCE"] == "--haico-dump-interval"
    details = json.loads(json_file.read_text())
    assert [m["id"] for m in details["models"]] == ["demo"]
    assert "metrics_start" in details and "metrics_end" in details

    secrets = secrets_file.read_text().split("\n")
    assert all(len(secret) >= 16 for secret in secrets)
    for path in campaign.arm_dir("demo").rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            for secret in secrets:
                assert secret.encode() not in content, (path, "holds a secret")


def test_a_second_run_names_the_provenance_that_changed(tmp_path: Path) -> None:
    first, second = tmp_path / "runs" / "1", tmp_path / "runs" / "2"
    for run, version in ((first, "0.11.0"), (second, "0.11.1")):
        run.mkdir(parents=True)
        config = RunConfig(run, redactor=Redactor())
        config.update({"VLLM_VERSION": version, "PYTHON_VERSION": "3.11.7", "NODE": str(run)})
        config.write()
    later = RunConfig(second, redactor=Redactor())
    later.update({"VLLM_VERSION": "0.11.1", "PYTHON_VERSION": "3.11.7", "NODE": "elsewhere"})
    assert later.changed_since(first) == ["VLLM_VERSION 0.11.0 → 0.11.1"]  # NODE: not compared


@pytest.mark.subprocess
def test_secrets_are_redacted_and_values_are_quoted_for_bash(tmp_path: Path) -> None:
    config = RunConfig(tmp_path, redactor=Redactor(["s3cret-token-value"]))
    config.update({"A": "it's $HOME `x`", "B": "Bearer s3cret-token-value"})
    config.write()
    text = (tmp_path / "run-config.env").read_text()
    assert "s3cret-token-value" not in text
    echoed = subprocess.run(
        ["bash", "-c", f"source {tmp_path / 'run-config.env'}; printf '%s|%s' \"$A\" \"$B\""],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert echoed == "it's $HOME `x`|Bearer [REDACTED]"


def test_metrics_are_read_from_prometheus_text_and_summed_over_labels() -> None:
    text = [
        "# HELP vllm:num_requests_running Number of requests running.",
        'vllm:num_requests_running{model_name="a"} 3.0',
        'vllm:num_requests_running{model_name="b"} 1.0',
        'vllm:prompt_tokens_total{model_name="a"} 1200',
        "vllm:unrelated 5",
        "garbage",
    ]
    assert parse_metrics(text) == {
        "vllm:num_requests_running": 4.0,
        "vllm:prompt_tokens_total": 1200.0,
    }


def test_what_served_the_run_is_read_from_its_version_answer() -> None:
    assert server_identity({"version": "0.32.0"}) == {
        "MODEL_SERVER": "vllm",
        "MODEL_SERVER_VERSION": "0.32.0",
        "VLLM_VERSION": "0.32.0",
    }
    unknown = {"MODEL_SERVER": "unknown", "MODEL_SERVER_VERSION": "unknown"}
    assert server_identity(None) == unknown
    assert server_identity({"detail": "Not Found"}) == unknown


# vLLM 0.32's start-up line, as its API server logs it.
NON_DEFAULT_ARGS_LINE = (
    "(APIServer pid=24093) INFO 12-01 22:51:17 [api_utils.py:286] non-default args: "
    "{'model_tag': '/models/smol', 'enable_auto_tool_choice': True, 'tool_call_parser': "
    "'hermes', 'host': '127.0.0.1', 'port': 20712, 'max_model_len': 2048}"
)


def test_vllms_non_default_args_are_read_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "llm.log"
    log.write_text(f"--- pytest-haico header\nTriton is installed\n{NON_DEFAULT_ARGS_LINE}\nmore\n")
    values, details = startup_values(log)
    text = NON_DEFAULT_ARGS_LINE.split("non-default args: ", 1)[1]
    assert values == {"VLLM_NON_DEFAULT_ARGS": text}
    assert details["vllm_non_default_args"]["tool_call_parser"] == "hermes"
    assert details["vllm_non_default_args"]["port"] == 20712
    # A line that is no Python literal is kept as text only; no line, or no log: nothing.
    log.write_text("INFO non-default args: {'dtype': <DType.float32>}\n")
    assert startup_values(log) == ({"VLLM_NON_DEFAULT_ARGS": "{'dtype': <DType.float32>}"}, {})
    log.write_text("INFO nothing of the kind\n")
    assert startup_values(log) == ({}, {})
    assert startup_values(tmp_path / "missing.log") == ({}, {})
    assert startup_values(None) == ({}, {})
