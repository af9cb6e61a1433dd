"""The two model servers the wire-contract suite holds against each other, and their clients."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import httpx
import openai
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

Kind = Literal["standin", "vllm"]
TIMEOUT = httpx.Timeout(120.0, connect=5.0)


@dataclass(frozen=True)
class Server:
    """One running model server, as a client sees it."""

    kind: Kind
    base_url: str
    api_key: str
    model: str
    root: str
    max_model_len: int
    version: str
    scratch_dir: Path | None = None  # real vLLM's $TMPDIR (the cluster profile's, private)
    # The HTTP clients its SDK clients were given, closed with the server's fixture.
    clients: list[httpx.Client] = field(default_factory=list, repr=False, compare=False)

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/v1"

    def get(self, path: str, *, key: str | None = None) -> httpx.Response:
        """GET *path*; with the server's key unless *key* says otherwise ("" for none)."""
        return httpx.get(
            self.base_url + path, headers=self._auth(key), timeout=TIMEOUT, trust_env=False
        )

    def chat(
        self, messages: list[dict[str, Any]], *, key: str | None = None, **fields: Any
    ) -> httpx.Response:
        """POST a chat completion (the served model unless *fields* names another)."""
        body = {"model": self.model, "messages": messages, **fields}
        return httpx.post(
            f"{self.api_base}/chat/completions",
            json=body,
            headers=self._auth(key),
            timeout=TIMEOUT,
            trust_env=False,
        )

    def stream(self, messages: list[dict[str, Any]], **fields: Any) -> list[dict[str, Any]]:
        """The decoded chunks of a streamed completion, asserting its SSE framing."""
        response = self.chat(messages, stream=True, **fields)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = list(iter_sse_data(response.text))
        assert payloads[-1] == "[DONE]"
        assert "[DONE]" not in payloads[:-1]
        return [json.loads(p) for p in payloads[:-1]]

    def openai(self, *, key: str | None = None) -> openai.OpenAI:
        """The official client, as users' code builds it (no retries: a refusal is the point)."""
        return openai.OpenAI(
            base_url=self.api_base,
            api_key=self.api_key if key is None else key,
            max_retries=0,
            # openai 3 types its client as httpx2's; httpx's works the same.
            http_client=cast(Any, self._client()),
        )

    def chat_openai(self, **options: Any) -> ChatOpenAI:
        """LangChain's ChatOpenAI, as the backend builds it."""
        return ChatOpenAI(
            model=self.model,
            base_url=self.api_base,
            api_key=SecretStr(self.api_key),
            max_retries=0,
            http_client=cast(Any, self._client()),
            **options,
        )

    def close(self) -> None:
        """Close every HTTP client `openai` and `chat_openai` made."""
        while self.clients:
            self.clients.pop().close()

    def _client(self) -> httpx.Client:
        client = httpx.Client(timeout=TIMEOUT, trust_env=False)
        self.clients.append(client)
        return client

    def _auth(self, key: str | None) -> dict[str, str]:
        key = self.api_key if key is None else key
        return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass(frozen=True)
class ServerPair:
    """One kind of server twice: started with the tool flags and without them."""

    tools: Server
    plain: Server

    @property
    def kind(self) -> Kind:
        return self.tools.kind

    def close(self) -> None:
        self.tools.close()
        self.plain.close()


def iter_sse_data(text: str) -> Iterator[str]:
    """The ``data:`` payloads of an SSE body, in order (asserting nothing else is in it)."""
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            yield block.removeprefix("data: ")


def iter_samples(metrics_text: str) -> Iterator[tuple[str, dict[str, str]]]:
    """``(name, labels)`` of each sample line of Prometheus text (label values unescaped
    enough for names and model names)."""
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_and_labels = line.rsplit(" ", 1)[0]
        name, _, rest = name_and_labels.partition("{")
        pairs = (item.split("=", 1) for item in rest.rstrip("}").split('",') if item)
        yield name, {key: value.strip('"') for key, value in pairs}
