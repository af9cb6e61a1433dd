"""Which vLLM release the stand-in imitates (``--vllm-version``) and what differs between releases.

Each property below is one behaviour that changed in a release, read from vLLM's code
(see the team's notes on vLLM); the stand-in asks these instead of comparing numbers itself.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

# The default: the last release whose server serves a named or "required" tool_choice through
# guided decoding when started without a tool-call parser.
DEFAULT_VLLM_VERSION = "0.13.0"
# The first release the stand-in was held against as a running server (tests/vllm). The
# properties gated on it are what 0.32.0 was seen doing; the release that brought each is not
# pinned down, so imitations of older releases keep what was read from their code.
SEEN_RELEASE = (0, 32, 0)
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?((?:\.post\d+|rc\d+|\.dev\d+)?)")


@dataclass(frozen=True, order=True)
class VllmVersion:
    """A vLLM release number, ordered by (major, minor, patch)."""

    release: tuple[int, int, int]
    text: str = field(compare=False)

    @property
    def nests_errors(self) -> bool:
        """``{"error": {message, type, param, code}}`` from 0.10.1; flat before."""
        return self.release >= (0, 10, 1)

    @property
    def refuses_guided_tool_choice_without_parser(self) -> bool:
        """From 0.14 a named or "required" ``tool_choice`` needs ``--tool-call-parser`` too."""
        return self.release >= (0, 14, 0)

    @property
    def dead_health_status(self) -> int:
        """``/health`` of a server whose engine died: 503 from 0.11, before that the 500 of
        its engine-error handler."""
        return 503 if self.release >= (0, 11, 0) else 500

    @property
    def shows_gpu_cache_usage(self) -> bool:
        """``vllm:gpu_cache_usage_perc``: hidden from 0.11 (deprecated in 0.9.2)."""
        return self.release < (0, 11, 0)

    @property
    def shows_kv_cache_usage(self) -> bool:
        """``vllm:kv_cache_usage_perc``, its replacement, from 0.9.2."""
        return self.release >= (0, 9, 2)

    @property
    def clamps_max_tokens_to_context(self) -> bool:
        """Prompt plus ``max_tokens`` over the context: the budget is clamped, and only a prompt
        or a ``max_tokens`` that alone exceeds it is refused (0.25 refused the sum)."""
        return self.release >= SEEN_RELEASE

    @property
    def names_tool_choice_function_plainly(self) -> bool:
        """``tool_choice=function "name" requires ...`` (0.14.1 printed the pydantic model)."""
        return self.release >= SEEN_RELEASE

    @property
    def lists_valid_model_aliases(self) -> bool:
        """An unknown model's 404 names the served ones and ``param: "model"``."""
        return self.release >= SEEN_RELEASE

    @property
    def finishes_calls_by_choice(self) -> bool:
        """A forced call finishes as OpenAI's API does: "stop" for a named ``tool_choice``,
        "tool_calls" for "required", streamed or not."""
        return self.release >= SEEN_RELEASE

    @property
    def streams_lean_chunks(self) -> bool:
        """Stream chunks carry no ``usage: null``; a tool call's header has no ``arguments``
        and its deltas ``content: null``; "length" rides on the last generated piece."""
        return self.release >= SEEN_RELEASE


def parse_vllm_version(text: str) -> VllmVersion:
    """An argparse type: ``0.13``, ``0.14.1`` or ``0.8.5.post1``."""
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a vLLM release number (e.g. 0.13.0, 0.14.1, 0.8.5.post1)"
        )
    major, minor, patch = (int(part or 0) for part in match.group(1, 2, 3))
    return VllmVersion((major, minor, patch), text.strip())
