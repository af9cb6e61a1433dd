"""Every numeric field has a sane range and a strict type; every required name is non-empty."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_haico.config.experiment import iter_scripts, load_arm, load_experiments
from pytest_haico.errors import ConfigError


def arm_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "arm.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_arm(path)
    return str(caught.value)


def script_error(tmp_path: Path, text: str, name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        list(iter_scripts(path))
    return str(caught.value)


def assert_message(message: str, pattern: str) -> None:
    pytest.LineMatcher([message]).fnmatch_lines([pattern])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[vllm]\ntensor_parallel_size = 17",
            "*vllm.tensor_parallel_size: Input should be less than or equal to 16, got 17",
        ),
        (
            "[vllm]\ndata_parallel_size = 64",
            "*vllm.data_parallel_size: Input should be less than or equal to 16, got 64",
        ),
        (
            "[vllm]\nmax_model_len = 100",
            "*vllm.max_model_len: Input should be greater than or equal to 256, got 100",
        ),
        (
            "[vllm]\nmax_model_len = 100000000",
            "*vllm.max_model_len: Input should be less than or equal to 10000000, got 100000000",
        ),
        (
            "[vllm]\nmax_model_len = 8192.0",
            "*vllm.max_model_len: Input should be a valid integer, got 8192.0",
        ),
        (
            "[generation]\nmax_tokens = 2000000",
            "*generation.max_tokens: Input should be less than or equal to 1000000, got 2000000",
        ),
        (
            "[vllm]\nmax_model_len = 4096\n[generation]\nmax_tokens = 4096",
            "*generation.max_tokens: must be below vllm.max_model_len (4096), or no prompt "
            "fits, got 4096",
        ),
        (
            "[vllm]\nmax_model_len = 1024",
            "*generation.max_tokens: the default (1024) leaves no room for a prompt within "
            "vllm.max_model_len (1024): set a smaller max_tokens",
        ),
        (
            "[generation]\ntemperature = nan",
            "*generation.temperature: Input should be a finite number, got nan",
        ),
        (
            "[generation]\ntemperature = 2.5",
            "*generation.temperature: Input should be less than or equal to 2, got 2.5",
        ),
        (
            "[agent]\nrecursion_limit = 1001",
            "*agent.recursion_limit: Input should be less than or equal to 1000, got 1001",
        ),
        (
            "[agent]\nrecursion_limit = 1e21",
            "*agent.recursion_limit: Input should be a valid integer, got 1e+21",
        ),
        (
            "[run]\nconcurrency = 5000",
            '*run.concurrency: expected an integer from 1 to 1024 or "auto", got 5000',
        ),
        (
            "[run]\nturn_timeout_s = inf",
            "*run.turn_timeout_s: Input should be a finite number, got inf",
        ),
        (
            "[run]\nturn_timeout_s = 100000",
            "*run.turn_timeout_s: Input should be less than or equal to 86400, got 100000",
        ),
        (
            "[run]\nturn_timeout_s = 0",
            "*run.turn_timeout_s: Input should be greater than 0, got 0",
        ),
        (
            "[standin]\nlatency_ms = 3600000",
            "*standin.latency_ms: Input should be less than or equal to 600000, got 3600000",
        ),
        (
            "[standin]\nseed = -1",
            "*standin.seed: Input should be greater than or equal to 0, got -1",
        ),
        (
            "[standin]\nseed = 4294967296",
            "*standin.seed: Input should be less than or equal to 4294967295, got 4294967296",
        ),
        (
            "[standin]\nrate_limit_rpm = 1000001",
            "*standin.rate_limit_rpm: Input should be less than or equal to 100000, got 1000001",
        ),
        (
            "[slurm]\ncpus_per_task = 100000",
            "*slurm.cpus_per_task: Input should be less than or equal to 1024, got 100000",
        ),
    ],
)
def test_numeric_arm_fields_are_bounded(tmp_path: Path, text: str, message: str) -> None:
    assert_message(arm_error(tmp_path, text), message)


def test_the_bounds_themselves_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "arm.toml"
    path.write_text(
        "[vllm]\ntensor_parallel_size = 16\ndata_parallel_size = 16\nmax_model_len = 10000000\n"
        "[generation]\nmax_tokens = 1000000\ntemperature = 2.0\n[agent]\nrecursion_limit = 1000\n"
        "[run]\nconcurrency = 1024\nturn_timeout_s = 86400\n"
        "[standin]\nlatency_ms = 600000\nseed = 4294967295\nrate_limit_rpm = 100000\n"
    )
    arm = load_arm(path)
    assert (arm.agent.recursion_limit, arm.run.concurrency) == (1000, 1024)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[vllm]\ntool_call_parser = " "',
            "*vllm.tool_call_parser: must name one of vLLM's tool call parsers "
            "(e.g. hermes, mistral, llama3_json), got ' '",
        ),
        (
            '[vllm]\nextra_args = ["--enforce-eager", ""]',
            "*vllm.extra_args item 2: must not be empty*",
        ),
        ('[model]\npath = ""', "*model.path: must not be empty, got ''"),
        ('[model]\nhf_id = "Qwen/Qwen2.5-7B"\nrevision = ""', "*model.revision: must not be*"),
        ('[model]\nserved_name = ""', "*model.served_name: String should have at least 1*"),
        ('[backend]\nimage = ""', "*backend.image: must not be empty, got ''"),
        ('[slurm]\npartition = ""', "*slurm.partition: must not be empty, got ''"),
        ('[slurm]\ntime_per_stratum = { long = "" }', "*slurm.time_per_stratum.long: must not*"),
    ],
)
def test_empty_names_are_refused(tmp_path: Path, text: str, message: str) -> None:
    assert_message(arm_error(tmp_path, text), message)


def test_a_parser_is_required_while_tool_calling_is_on() -> None:
    from pydantic import ValidationError

    from pytest_haico.config.experiment import Arm

    with pytest.raises(ValidationError, match="required while enable_tool_calling is true"):
        Arm.model_validate({"name": "a", "vllm": {"tool_call_parser": None}})
    off = Arm.model_validate(
        {"name": "a", "vllm": {"enable_tool_calling": False, "tool_call_parser": None}}
    )
    assert off.vllm.tool_call_parser is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "id: a\nrepeats: 1000000\nturns:\n  - user: hi\n",
            "*s.yaml: repeats: Input should be less than or equal to 1000, got 1000000",
        ),
        (
            "id: a\nturns:\n" + "  - user: hi\n" * 201,
            "*s.yaml: turns: List should have at most 200 items after validation, not 201",
        ),
        (
            "id: a\nturns:\n  - user: " + "x" * 200_001 + "\n",
            "*s.yaml: turn 1, user: String should have at most 200000 characters, got 'xxx*",
        ),
        (
            "id: a\nturns:\n  - user: '   '\n",
            "*s.yaml: turn 1, user: must not be blank, got '   '",
        ),
        (
            "id: " + "a" * 129 + "\nturns:\n  - user: hi\n",
            "*s.yaml: id: String should have at most 128 characters, got 'aaaa*",
        ),
        (
            "id: a\ntags: [" + ", ".join(f"t{i}" for i in range(33)) + "]\nturns:\n  - user: hi\n",
            "*s.yaml: tags: List should have at most 32 items after validation, not 33",
        ),
    ],
)
def test_script_sizes_are_bounded(tmp_path: Path, text: str, message: str) -> None:
    assert_message(script_error(tmp_path, text), message)


def test_a_script_file_above_the_size_bound_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_haico.config import documents

    monkeypatch.setattr(documents, "MAX_SCRIPT_FILE_BYTES", 1024)
    message = script_error(tmp_path, "id: a\nturns:\n" + "  - user: hi\n" * 100)
    assert_message(message, "*s.yaml: the script file has 1313 bytes, more than 1024: *split it*")


def test_a_campaign_above_the_item_bound_is_refused_before_its_items_are_built(
    tmp_path: Path,
) -> None:
    (tmp_path / "arms").mkdir()
    (tmp_path / "scripts").mkdir()
    for name in ("one", "two"):
        (tmp_path / "arms" / f"{name}.toml").write_text('description = "x"\n')
    lines = [f'{{"id": "s{i}", "repeats": 1000, "turns": [{{"user": "{i}"}}]}}' for i in range(51)]
    (tmp_path / "scripts" / "all.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as caught:
        load_experiments(tmp_path)
    assert_message(
        str(caught.value),
        f"{tmp_path}: the campaign has 102000 items (2 arms x 51000 script repeats); at most "
        "100000 per experiments directory: lower repeats, or split the scripts over several "
        "experiments directories (--haico-experiments)",
    )
