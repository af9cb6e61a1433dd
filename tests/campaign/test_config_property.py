"""Property: breaking ONE field of a schema-valid document yields an error naming that field."""

from __future__ import annotations

import copy
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_haico.config.experiment import iter_scripts, load_arm
from pytest_haico.errors import ConfigError

names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)

# field path -> (strategy of valid values, wrong values)
ARM_FIELDS: dict[tuple[str, str], tuple[st.SearchStrategy[Any], list[Any]]] = {
    ("model", "served_name"): (names, [5, "Bad Name", ""]),
    ("vllm", "tensor_parallel_size"): (st.integers(1, 16), [0, -1, 17, "2", 1.5, True]),
    ("vllm", "data_parallel_size"): (st.integers(1, 16), [0, 17, "1"]),
    # Above the default max_tokens (1024), which must fit below it.
    ("vllm", "max_model_len"): (st.integers(1025, 10_000_000), [0, 255, 10**8, "4096", 40.5]),
    ("vllm", "enable_tool_calling"): (st.booleans(), ["yes", 1]),
    ("vllm", "tool_call_parser"): (names, [7, ["hermes"], "", " ", "two words"]),
    ("vllm", "extra_args"): (st.lists(names, max_size=3), ["--x", [1], [""]]),
    # Below the smallest valid max_model_len, so any valid document stays valid.
    ("generation", "max_tokens"): (st.integers(1, 255), [0, 10**7, "big", 1.0]),
    ("generation", "temperature"): (st.floats(0, 2), [-0.5, 2.5, "warm"]),
    ("agent", "recursion_limit"): (st.integers(1, 1000), [0, 1001, 10**15, "many", 2.5]),
    ("run", "concurrency"): (st.integers(1, 1024), [0, 1025, "16"]),
    ("run", "turn_timeout_s"): (st.floats(0.01, 86_400), [0, -1, "600s", 86_401]),
    ("standin", "persona"): (st.sampled_from(["helpful", "looper", "blank"]), ["nope", 3]),
    ("standin", "latency_ms"): (st.integers(0, 600_000), [-1, 600_001, "20", 1.5]),
    ("standin", "seed"): (st.integers(0, 2**32 - 1), ["0", 0.5, -1, 2**32]),
    ("standin", "rate_limit_rpm"): (st.integers(0, 100_000), [-1, 100_001, "60"]),
}


@st.composite
def valid_arm(draw: st.DrawFn) -> dict[str, Any]:
    chosen = draw(st.lists(st.sampled_from(sorted(ARM_FIELDS)), min_size=1, unique=True))
    document: dict[str, Any] = {}
    for section, key in chosen:
        document.setdefault(section, {})[key] = draw(ARM_FIELDS[(section, key)][0])
    return document


def dump_toml(document: dict[str, Any]) -> str:
    lines = []
    for section, values in document.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def config_error_of(filename: str, text: str) -> ConfigError:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / filename
        path.write_text(text)
        with pytest.raises(ConfigError) as caught:
            if filename.endswith(".toml"):
                load_arm(path)
            else:
                list(iter_scripts(path))
    return caught.value


def assert_names(error: ConfigError, field: str) -> None:
    """The error names `field` or a field under it (`turn 2` has `turn 2, user` under it,
    `tags` has `tag 1`)."""
    within = (field + ".", field + ", ", field + " item ", field.removesuffix("s") + " ")
    assert error.field == field or error.field.startswith(within), str(error)


@settings(max_examples=150, deadline=None)
@given(document=valid_arm(), data=st.data())
def test_one_bad_arm_field_is_named(document: dict[str, Any], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:  # the unmutated document must load
        (Path(tmp) / "arm.toml").write_text(dump_toml(document))
        load_arm(Path(tmp) / "arm.toml")
    section = data.draw(st.sampled_from(sorted(document)))
    mutated = copy.deepcopy(document)
    if data.draw(st.booleans(), label="unknown key instead of a bad value"):
        key = data.draw(names.filter(lambda k: k not in mutated[section]))
        mutated[section][key] = 1
    else:
        key = data.draw(st.sampled_from(sorted(mutated[section])))
        mutated[section][key] = data.draw(st.sampled_from(ARM_FIELDS[(section, key)][1]))
    text = dump_toml(mutated)
    assert tomllib.loads(text) == mutated
    assert_names(config_error_of("arm.toml", text), f"{section}.{key}")


@st.composite
def valid_script(draw: st.DrawFn) -> dict[str, Any]:
    turns: list[dict[str, Any]] = []
    for index in range(draw(st.integers(1, 4))):
        turn: dict[str, Any] = {"user": draw(st.text(min_size=1, max_size=20).filter(str.strip))}
        if index and draw(st.booleans()):
            turn["branch_from"] = draw(st.integers(0, index - 1))
        if draw(st.booleans()):
            turn["expect"] = {"artifact": draw(st.booleans())}
        turns.append(turn)
    return {
        "id": draw(st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,10}", fullmatch=True)),
        "stratum": draw(names),
        "tags": draw(
            st.lists(
                names.filter(
                    lambda t: (
                        t not in {"skip", "xfail", "timeout", "flaky", "trylast", "tryfirst"}
                        and not t.startswith("haico")
                    )
                ),
                max_size=2,
            )
        ),
        "repeats": draw(st.integers(1, 5)),
        "turns": turns,
    }


SCRIPT_MUTATIONS: dict[str, list[Any]] = {
    "id": ["Bad Id", 5, "", "a" * 129],
    "stratum": ["Long Stratum", 3],
    "tags": ["smoke", ["Bad-Tag"], ["skip"], [1]],
    "repeats": [0, "2", 1.5, -1, 1001],
    "turns": [[], "hello", [{"text": "hi"}]],
    "user": ["", " ", 5, None],
    "branch_from": [-1, "0", 0.5],
    "expect": [{"artifact": "yes"}, {"artefact": True}, "artifact"],
}


@settings(max_examples=150, deadline=None)
@given(document=valid_script(), data=st.data())
def test_one_bad_script_field_is_named(document: dict[str, Any], data: st.DataObject) -> None:
    text = yaml.safe_dump(document)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "s.yaml").write_text(text)
        list(iter_scripts(Path(tmp) / "s.yaml"))
    mutated = copy.deepcopy(document)
    where = data.draw(
        st.sampled_from(["id", "stratum", "tags", "repeats", "turns", "turn", "unknown"])
    )
    if where == "unknown":
        key = data.draw(names.filter(lambda k: k not in mutated))
        mutated[key] = "x"
        field = key
    elif where == "turn":
        index = data.draw(st.integers(0, len(mutated["turns"]) - 1))
        key = data.draw(st.sampled_from(["user", "branch_from", "expect"]))
        mutated["turns"][index][key] = data.draw(st.sampled_from(SCRIPT_MUTATIONS[key]))
        if key == "branch_from" and data.draw(st.booleans()):
            mutated["turns"][index][key] = index  # the same turn, or (below) a later one
        field = f"turn {index + 1}, {key}"
    else:
        mutated[where] = data.draw(st.sampled_from(SCRIPT_MUTATIONS[where]))
        field = where
    assert_names(config_error_of("s.yaml", yaml.safe_dump(mutated)), field)
