"""The 4xx answers vLLM gives a chat request before generating anything, in its own words."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_haico.standins.openai_wire import ChatRequest, NamedToolChoice, ToolChoice
from pytest_haico.standins.vllm_versions import VllmVersion

# vLLM's own wording, so that clients and gates that match on it see the real thing.
TOOLS_WITHOUT_FLAG = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)


@dataclass(frozen=True)
class Refusal:
    """An error answer: status code, vLLM's error type and message, the parameter it names."""

    code: int
    error_type: str
    message: str
    param: str | None = None


def _bad_request(message: str, param: str | None = None) -> Refusal:
    return Refusal(400, "BadRequestError", message, param)


def invalid_request(chat: ChatRequest) -> Refusal | None:
    """What vLLM's request model refuses while parsing the body (its ``check_tool_usage``)."""
    choice = chat.tool_choice
    if choice not in (None, "none") and chat.tools is None:
        return _bad_request("When using `tool_choice`, `tools` must be set.")
    names = {t.function.name for t in chat.tools or []}
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        return _bad_request(
            "The tool specified in `tool_choice` does not match any of the specified `tools`"
        )
    return None


def unknown_model(
    chat: ChatRequest, served_model_names: tuple[str, ...], *, version: VllmVersion
) -> Refusal | None:
    """404 for a model name the server does not serve."""
    served = chat.model or served_model_names[0]
    if served in served_model_names:
        return None
    message = f"The model `{served}` does not exist."
    if not version.lists_valid_model_aliases:
        return Refusal(404, "NotFoundError", message)
    aliases = ", ".join(served_model_names)
    return Refusal(404, "NotFoundError", f"{message} Valid aliases: {aliases}.", "model")


def tool_choice_refusal(
    chat: ChatRequest, *, auto_tool_choice: bool, version: VllmVersion
) -> Refusal | None:
    """400 for tools the server was not started to handle.

    Without ``--enable-auto-tool-choice --tool-call-parser`` vLLM refuses "auto" (which an
    omitted ``tool_choice`` becomes when tools are sent), but up to 0.13 it serves a named or
    "required" choice through guided decoding; from 0.14 it refuses those too. "none" is
    always served.
    """
    if auto_tool_choice:
        return None
    choice = chat.effective_tool_choice
    if choice == "auto":
        return _bad_request(TOOLS_WITHOUT_FLAG)
    if choice != "none" and version.refuses_guided_tool_choice_without_parser:
        return _bad_request(guided_without_parser(choice, version=version))
    return None


def guided_without_parser(choice: ToolChoice, *, version: VllmVersion) -> str:
    """vLLM's message (from 0.14) for a named or "required" choice without a tool-call parser.

    vLLM 0.14 formats the parsed choice into an f-string, so a named one shows as its
    pydantic model's ``str()``; 0.32 names the function.
    """
    if isinstance(choice, NamedToolChoice) and version.names_tool_choice_function_plainly:
        return (
            f'tool_choice=function "{choice.function.name}" requires --tool-call-parser to be set'
        )
    if isinstance(choice, NamedToolChoice):
        shown = (
            f"function=ChatCompletionNamedFunction(name={choice.function.name!r}) type='function'"
        )
    else:
        shown = choice
    return f'tool_choice="{shown}" requires --tool-call-parser to be set'


def context_refusal(
    chat: ChatRequest, *, prompt_tokens: int, max_model_len: int, version: VllmVersion
) -> Refusal | None:
    """400 when the prompt and the completion budget do not fit the context (from 0.32: when
    either alone does not; the sum is clamped)."""
    limit = chat.token_limit
    if version.clamps_max_tokens_to_context:
        return _alone_too_long(chat, prompt_tokens=prompt_tokens, max_model_len=max_model_len)
    if prompt_tokens + (limit or 1) <= max_model_len:
        return None
    return _bad_request(
        f"This model's maximum context length is {max_model_len} tokens. "
        f"However, you requested {prompt_tokens + (limit or 0)} tokens "
        f"({prompt_tokens} in the messages, {limit or 0} in the completion). "
        "Please reduce the length of the messages or completion."
    )


def _alone_too_long(chat: ChatRequest, *, prompt_tokens: int, max_model_len: int) -> Refusal | None:
    """vLLM 0.32's checks: the completion budget, then the prompt, each against the context."""
    limit = chat.token_limit
    if limit is not None and limit > max_model_len:
        field = "max_tokens" if chat.max_completion_tokens is None else "max_completion_tokens"
        return _bad_request(
            f"{field}={limit} cannot be greater than max_model_len={max_model_len}. Please "
            f"request fewer output tokens. (parameter={field}, value={limit})",
            field,
        )
    if prompt_tokens <= max_model_len:
        return None
    # vLLM's tokenizer stops one token past the context, so it knows "at least" that many.
    seen = max_model_len + 1
    return _bad_request(
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
        f"contains at least {seen} input tokens, which exceeds this limit even without any "
        f"output tokens. Please reduce the length of the input prompt. "
        f"(parameter=input_tokens, value={seen})",
        "input_tokens",
    )
