"""An arm that uses a served model (`[model] served`, `--haico-model`): resolved in the
catalogue at the start of every run, its identity gated against the arm's model.

Gate `served_model` (static: before anything starts) refuses, with exit 78, a name the
catalogue does not have or cannot vouch for (stale, planted, writable by others), and a
served model that is not the arm's: another served name, other weights (config.json's or
the shard index's hash, HF id or revision) or another vLLM configuration, naming each
difference. The items' identity is the arm's own model identity, so a served model and the
same model started by a run share items.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pytest_haico.config.experiment import Arm
from pytest_haico.config.identity import model_identity, parse_model_identity
from pytest_haico.config.settings import Profile, Settings
from pytest_haico.errors import CatalogueError
from pytest_haico.gates.dynamic import SERVED_MODEL
from pytest_haico.gates.result import GateResult, failed, passed
from pytest_haico.serve.catalogue import CatalogueEntry
from pytest_haico.serve.resolver import ServedModel, resolve_served
from pytest_haico.stack.request import ModelEndpoint

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def served_name(settings: Settings, arm: Arm) -> str | None:
    """The catalogue name the arm's model is found under: --haico-model, else the arm's."""
    return settings.model or arm.model.served


class ServedCheck:
    """The served model of one arm's run: resolved and gated once, at the run's start."""

    def __init__(
        self, settings: Settings, arm: Arm, name: str, *, here: Collection[str] = ()
    ) -> None:
        self.settings = settings
        self.arm = arm
        self.name = name
        self.here = frozenset(here)  # this host's names (`slurm.hostlist.this_host_names`)
        self.served: ServedModel | None = None

    def gate(self) -> GateResult:
        try:
            served = resolve_served(self.name, catalogue=self.settings.catalogue)
            api_key = served.api_key()
        except CatalogueError as exc:
            return failed(
                SERVED_MODEL,
                str(exc),
                f"serve it (`haico serve {self.arm.name} --name {self.name}`) or name another "
                "with [model] served / --haico-model; then rerun",
            )
        differences = identity_differences(self.arm, served, profile=self.settings.profile)
        if differences:
            return failed(
                SERVED_MODEL,
                f"the served model {self.name!r} (job {served.entry.job.id}) is not arm "
                f"{self.arm.name}'s model: {'; '.join(differences)}",
                f"serve arm {self.arm.name} itself (`haico serve {self.arm.name}`), or make the "
                "arm say what is served",
            )
        self.served = served
        self._api_key = api_key
        return passed(
            SERVED_MODEL,
            f"{self.name!r} at {served.endpoint}, job {served.entry.job.id}: the arm's model",
        )

    def provenance(self) -> dict[str, str]:
        """run-config's account of the served model that answers the run (after a passed
        gate): its catalogue name, its job and node, the arm that serves it, its owner."""
        assert self.served is not None, "the served_model gate has not passed"
        entry = self.served.entry
        return {
            "SERVED_MODEL": self.name,
            "SERVED_MODEL_JOB": entry.job.id,
            "SERVED_MODEL_NODE": entry.job.node,
            "SERVED_MODEL_ARM": entry.arm,
            "SERVED_MODEL_OWNER": entry.owner.name,
            "SERVED_MODEL_URL": entry.endpoint,
        }

    def describe(self) -> str:
        """The summary's words for it: `'qwen32b' (job 41 on gpu07, http://gpu07:8011/v1)`."""
        assert self.served is not None, "the served_model gate has not passed"
        entry = self.served.entry
        return f"{self.name!r} (job {entry.job.id} on {entry.job.node}, {entry.endpoint})"

    def endpoint(self) -> ModelEndpoint:
        """The endpoint the backend is given, with its key (after a passed gate). A server
        on this node (it serves on every interface) is named under .localhost, whose host
        says `vllm` to the backend; one on another node is reached through the stack's
        relay, named so too (the backend would not send its key to `http://<node>:…`)."""
        assert self.served is not None, "the served_model gate has not passed"
        return backend_endpoint(self.served.entry, self._api_key, here=self.here)


def backend_endpoint(
    entry: CatalogueEntry, api_key: str, *, here: Collection[str] = ()
) -> ModelEndpoint:
    """How a backend on the host named `here` reaches the served model of `entry`: on its
    own loopback under `vllm.localhost` when the model runs on this host, else at the
    entry's node (which the stack relays: `ModelEndpoint.relayed`)."""
    if entry.host in _LOOPBACK or entry.host in here:
        return ModelEndpoint(f"http://vllm.localhost:{entry.port}/v1", api_key)
    return ModelEndpoint(entry.endpoint, api_key)


def identity_differences(arm: Arm, served: ServedModel, *, profile: Profile) -> list[str]:
    """How what `served` serves differs from what `arm` says it runs (none: the same)."""
    found: list[str] = []
    if served.served_name != arm.served_name:
        found.append(f"served name {served.served_name!r}, the arm's {arm.served_name!r}")
    ours = parse_model_identity(model_identity(arm, profile=profile))
    theirs = parse_model_identity(served.identity.model)
    found += _differing("model", theirs, ours)
    found += _differing("vllm", served.identity.vllm, arm.vllm.model_dump(mode="json"))
    return found


def _differing(section: str, served: dict[str, Any], arm: dict[str, Any]) -> list[str]:
    return [
        f"{section}.{key}: served {served.get(key)!r}, the arm's {arm.get(key)!r}"
        for key in sorted(set(served) | set(arm))
        if served.get(key) != arm.get(key)
    ]
