"""The cluster profile with real vLLM: a campaign whose stack starts vLLM 0.32 from the tier's
venv (waited for by its process and its log), gates it, holds real conversations with it
through the stand-in backend and records what served them; and the faults a run must name:
vLLM killed under the conversations, a USR1 drain. Each campaign starts its own vLLM (about 90 s
of both cores here): it is the vLLM the test kills or drains, or whose start it checks. Where
vLLM keeps its sockets is seen on the tier's shared pair."""

from __future__ import annotations

import os
import signal
import stat
from typing import Any

import pytest

from tests.integration.test_gates_in_a_run import DYNAMIC, STATIC
from tests.vllm.real_vllm import CPU_EXTRA_ARGS, MAX_MODEL_LEN
from tests.vllm.servers import ServerPair
from tests.vllm.vllm_campaign import ARM, JOB_ID, TURN_TIMEOUT_S, VllmCampaign, log_header_argv

pytestmark = pytest.mark.vllm

SCRIPTS = 3
TURNS = 2
# Verdicts a weak model may earn; none is an infrastructure failure.
MODEL_VERDICTS = {"completed", "blank_turn", "recursion_limit", "expectation_failed"}


def _transcripts(tier_campaign: VllmCampaign) -> int:
    directory = tier_campaign.project.arm_dir(ARM) / "transcripts"
    return len(list(directory.glob("*.jsonl"))) if directory.is_dir() else 0


def test_a_cluster_campaign_starts_real_vllm_gates_it_and_records_what_served_it(
    tier_campaign: VllmCampaign,
) -> None:
    tier_campaign.arm()
    tier_campaign.scripts(SCRIPTS, turns=TURNS)
    result = tier_campaign.run()
    output = result.stdout.str() + result.stderr.str()

    gates = tier_campaign.gates()
    assert (gates["passed"], gates["failed_gate"]) == (True, None), output
    assert [gate["name"] for gate in gates["gates"]] == STATIC + DYNAMIC
    detail = {gate["name"]: gate["detail"] for gate in gates["gates"]}
    assert detail["vllm_environment"].startswith("vllm 0.32.0+cpu at ")
    assert "hermes" in detail["tool_calling_flags"]

    # Whatever the small model earns, honestly: every item recorded, its turns with real
    # token counts from vLLM, and the exit code that its verdicts give.
    records = tier_campaign.records()
    assert sorted(r["script"] for r in records) == [f"s{i}" for i in range(SCRIPTS)]
    verdicts = {r["verdict"] for r in records}
    assert verdicts <= MODEL_VERDICTS, output
    assert result.ret == (0 if verdicts == {"completed"} else 1), output
    for record in records:
        assert 1 <= len(record["turns"]) <= TURNS
        for turn in record["turns"]:
            assert turn["tokens_in"] > 0 and turn["tokens_out"] > 0, record
            assert (turn["provider"], turn["model_id"]) == (
                "vllm",
                tier_campaign.manifest.served_name,
            )
    completed = [r for r in records if r["verdict"] == "completed"]
    assert all(len(r["turns"]) == TURNS for r in completed)

    # The arm's flags, built as on a cluster, started the venv's vLLM.
    run = tier_campaign.run_dir()
    argv = log_header_argv(run / "logs" / "llm.log")
    assert argv[:3] == [
        f"{tier_campaign.manifest.venv}/bin/vllm",
        "serve",
        tier_campaign.manifest.model,
    ]
    assert argv[-len(CPU_EXTRA_ARGS) :] == list(CPU_EXTRA_ARGS)
    assert {"--enable-auto-tool-choice", "--max-model-len"} <= set(argv)
    llm_log = (run / "logs" / "llm.log").read_text()
    assert "Application startup complete." in llm_log

    # What served the run: vLLM's own account of itself, and its start-up line.
    config = tier_campaign.run_config()
    values = config["values"]
    assert (values["MODEL_SERVER"], values["MODEL_SERVER_VERSION"]) == ("vllm", "0.32.0")
    assert values["VLLM_VERSION"] == "0.32.0" and "STANDIN_VLLM_VERSION" not in values
    assert values["SLURM_JOB_ID"] == JOB_ID
    assert values["ENV_VLLM_TARGET_DEVICE"] == "cpu"
    assert f"Starting vLLM server on http://127.0.0.1:{values['VLLM_PORT']}" in llm_log
    args = config["vllm_non_default_args"]
    assert args["model_tag"] == tier_campaign.manifest.model
    assert (args["enable_auto_tool_choice"], args["tool_call_parser"]) == (True, "hermes")
    assert (args["served_model_name"], args["max_model_len"]) == (
        [tier_campaign.manifest.served_name],
        MAX_MODEL_LEN,
    )
    assert "'tool_call_parser': 'hermes'" in values["VLLM_NON_DEFAULT_ARGS"]
    assert config["models"] == [
        {
            "id": tier_campaign.manifest.served_name,
            "root": tier_campaign.manifest.model,
            "max_model_len": MAX_MODEL_LEN,
        }
    ]
    assert config["cache_config"]["block_size"] == "128"  # vLLM for CPUs
    start, end = config["metrics_start"], config["metrics_end"]
    assert end["vllm:generation_tokens_total"] > start["vllm:generation_tokens_total"]
    spent = sum(turn["tokens_out"] for r in records for turn in r["turns"])
    assert end["vllm:generation_tokens_total"] - start["vllm:generation_tokens_total"] >= spent
    assert end["vllm:num_requests_running"] == 0

    assert tier_campaign.left_behind() == []


def test_vllm_makes_its_sockets_in_the_private_directory_the_model_service_gives_it(
    real_vllm: ServerPair,
) -> None:
    # vLLM's processes talk over ZeroMQ sockets it names in $TMPDIR (VLLM_RPC_BASE_PATH's
    # default) and, killed, leaves there: in the shared $TMPDIR they would pile up.
    for server in (real_vllm.tools, real_vllm.plain):
        assert server.scratch_dir is not None
        names = [p.name for p in server.scratch_dir.iterdir() if stat.S_ISSOCK(p.lstat().st_mode)]
        assert names, sorted(p.name for p in server.scratch_dir.iterdir())


def _stop_reason(record: dict[str, Any]) -> str:
    error = record.get("error") or {}
    return f"{error.get('kind')}: {error.get('message', '')[:120]}"


def test_vllm_killed_under_the_conversations_is_named_within_seconds_and_exits_75(
    tier_campaign: VllmCampaign,
) -> None:
    tier_campaign.arm()
    tier_campaign.scripts(6, turns=8)  # long talks: the kill lands mid-conversation
    run = tier_campaign.start("--haico-exit", "campaign")
    run.wait_for(lambda: _transcripts(tier_campaign) >= 3, timeout=900, what="3 conversations")
    llm = tier_campaign.services()["llm"]

    os.kill(llm, signal.SIGKILL)
    # At once: a run that waited for the turns' timeout would end only 600 s on.
    code = run.wait(timeout=TURN_TIMEOUT_S / 5)

    output = run.output()
    assert code == 75, output
    records = tier_campaign.records()
    in_flight = [r for r in records if r["verdict"] == "infra_error"]
    assert len(in_flight) == 3, [(r["verdict"], _stop_reason(r)) for r in records]
    for record in in_flight:
        assert record["error"]["kind"] == "service_died"
        assert record["error"]["message"].startswith(
            f"llm (pid {llm}) was killed by SIGKILL while conversations were in flight; last "
            "lines of "
        )
    pytest.LineMatcher(output.splitlines()).fnmatch_lines(
        [f"stopped (exit 75): llm (pid {llm}) was killed by SIGKILL while conversations were*"]
    )
    assert tier_campaign.left_behind() == []


def test_usr1_drains_a_run_with_real_vllm_in_its_stack_and_leaves_no_vllm(
    tier_campaign: VllmCampaign,
) -> None:
    tier_campaign.arm(concurrency=2)
    tier_campaign.scripts(8, turns=1)
    run = tier_campaign.start()
    run.wait_for(lambda: tier_campaign.records() != [], timeout=900, what="a record")
    run.send_signal(signal.SIGUSR1)
    code = run.wait(timeout=TURN_TIMEOUT_S)
    output = run.output()
    assert code == 75, output
    assert "drained (exit 75): SIGUSR1: draining:" in output
    records = tier_campaign.records()
    assert 1 <= len(records) < 8
    # The drain timeout (120 s) covered the conversations in flight: each ran to its end.
    assert {r["verdict"] for r in records} <= MODEL_VERDICTS, output
    assert tier_campaign.left_behind() == []
