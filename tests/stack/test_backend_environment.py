"""What a backend inherits: never a real model provider's key or a tracing service's."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from tests.harness import CONVERSATION_MODULE, CampaignProject

# Values no other variable holds (a bare "true" is in many environments): found = inherited.
PROVIDER_ENV = {
    "OPENAI_API_KEY": "sk-real-provider-key",
    "ANTHROPIC_API_KEY": "sk-ant-real",
    "LANGSMITH_TRACING": "true-from-the-shell",
    "LANGCHAIN_API_KEY": "ls-real",
    "SOME_SERVICE_API_TOKEN": "tok-real",
}


def test_a_backend_build_gets_the_stacks_key_and_no_provider_credentials(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    dump = tmp_path / "backend-env.json"
    # The stand-in backend, run as a build under test that first writes what it was given.
    backend = (
        "import json, os, sys; "
        f"open({str(dump)!r}, 'w').write(json.dumps(dict(os.environ))); "
        "os.execv(sys.executable, [sys.executable, '-m', 'pytest_haico.standins.backend', "
        "'--host', '127.0.0.1', '--port', sys.argv[1]])"
    )
    command = shlex.join([sys.executable, "-c", backend]) + " {port}"
    for name, value in {**PROVIDER_ENV, "HAICO_UNRELATED": "kept"}.items():
        monkeypatch.setenv(name, value)
    campaign.arm("demo")
    campaign.simple_scripts("a")
    campaign.write("test_conversations.py", CONVERSATION_MODULE)

    run = campaign.run_subprocess("--haico-backend-cmd", command)
    assert run.ret == 0, run.stdout.str()

    environ = json.loads(dump.read_text())
    assert not set(PROVIDER_ENV) & set(environ)
    assert not any(value in json.dumps(environ) for value in PROVIDER_ENV.values())
    assert environ["HAICO_UNRELATED"] == "kept"  # everything else is inherited
    assert environ["VLLM_API_KEY"] and environ["ADMIN_DEFAULT_API_TOKEN"]
