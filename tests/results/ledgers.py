"""Hand-written campaigns for the results API's tests: ledger records of schema 1 and 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def record(
    item: str,
    *,
    schema: int = 2,
    arm: str = "demo",
    run_id: str = "local-1.1",
    attempt: int = 1,
    verdict: str = "completed",
    script: str | None = None,
    repeat: int = 0,
    stratum: str = "default",
    finished_at: str = "2026-11-01T10:00:10+00:00",
    duration_s: float = 2.0,
    turns: int = 2,
) -> dict[str, Any]:
    """One record; `item` names it (its item_id is `item` padded to 64 hex digits)."""
    model = {"path": "/models/m", "config_sha256": "cd" * 32}
    data: dict[str, Any] = {
        "schema": schema,
        "run_id": run_id,
        "campaign": "c",
        "arm": arm,
        "stratum": stratum,
        "item_id": item_id(item),
        "nodeid": f"t.py::test_conversation[{arm}-{script or item}-r{repeat}]",
        "script": script or item,
        "script_sha256": "ab" * 32,
        "repeat": repeat,
        "attempt": attempt,
        "outcome": "passed" if verdict == "completed" else "failed",
        "verdict": verdict,
        "started_at": "2026-11-01T10:00:00+00:00",
        "finished_at": finished_at,
        "duration_s": duration_s,
        "in_flight_at_start": 1,
        "model_identity": model if schema == 2 else "standin:" + json.dumps(model),
        "backend_identity": "standin:pytest_haico.standins.backend@0.1.0",
        "turns": [
            {
                "index": i,
                "latency_s": 0.5,
                "steps": 1,
                "tool_calls": i,
                "tool_errors": 0,
                "tokens_in": 100,
                "tokens_out": 10 * (i + 1),
            }
            for i in range(turns)
        ],
        "error": None if verdict == "completed" else {"kind": verdict, "message": "no"},
        "slurm": None,
        "harness_version": "0.1.0",
    }
    if schema == 2:
        data["tags"] = ["smoke"]
        data["settings"] = {
            "model": {"served_name": "demo"},
            "generation": {"max_tokens": 512, "temperature": 0.7},
            "agent": {"recursion_limit": 12},
            "vllm": {"max_model_len": 8192},
        }
        data["turns"][0]["expectations"] = [
            {"expect": "artifact", "passed": verdict != "expectation_failed", "seen": "none"}
        ]
    return data


def item_id(name: str) -> str:
    return name.encode().hex().ljust(64, "0")[:64]


def write_ledger(arm_dir: Path, run_id: str, lines: list[dict[str, Any] | str]) -> Path:
    """`<arm_dir>/ledger/<run_id>.jsonl` from records (dicts) and raw lines (str), and an
    empty transcript for every record."""
    path = arm_dir / "ledger" / f"{run_id}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    (arm_dir / "transcripts").mkdir(exist_ok=True)
    text = []
    for line in lines:
        if isinstance(line, dict):
            text.append(json.dumps(line) + "\n")
            name = f"{line['item_id']}.{line['run_id']}.{line['attempt']}.jsonl"
            (arm_dir / "transcripts" / name).write_text(
                json.dumps({"haico_transcript": 1, "item_id": line["item_id"]})
                + "\n"
                + json.dumps({"turn": 0, "kind": "request", "body": {"query": "hi"}})
                + "\n"
            )
        else:
            text.append(line)
    path.write_text("".join(text))
    return path
