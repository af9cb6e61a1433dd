"""cluster.env: the site's settings as sourceable KEY=VALUE lines."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.limits import MAX_CLUSTER_ENV_BYTES
from pytest_haico.errors import ConfigError
from pytest_haico.files import read_input_file

# What a site may set; anything else is a typo until proven otherwise.
KNOWN_KEYS = {
    "CLUSTER_WORK": "shared work directory; results go to $CLUSTER_WORK/results",
    "VLLM_VENV": "virtualenv with vLLM installed (`haico env` builds it)",
    "VLLM_REQUIREMENTS": "the pinned requirements (a lock: name==version per line) `haico env` "
    "installs into VLLM_VENV; relative to cluster.env's directory",
    "BACKEND_IMAGE": "backend OCI image pinned by digest (docker://...@sha256:...) or a SIF",
    "POSTGRES_IMAGE": "Postgres OCI image pinned by digest, or a SIF",
    "SIF_DIR": "where pulled images are kept as SIFs (default: $CLUSTER_WORK/sif)",
    "HF_HOME": "Hugging Face cache holding the models (read with HF_HUB_OFFLINE=1)",
    "PARTITION": "default Slurm partition",
    "CPU_PARTITION": "the Slurm partition of `haico env`'s job (default: Slurm's default one)",
    "REGISTRY_TOKEN_FILE": "a file of mode 0600 holding the registry token `haico env` pulls "
    "the images with",
    "REGISTRY_USER": "the registry user that goes with the token (default: $USER)",
    "GPU_MIN_TFLOPS": "the TFLOP/s each device must reach in `haico gpu-check`'s burn",
    "ACCOUNT": "Slurm account to charge",
    "QOS": "Slurm QOS",
    "PHOENIX_ENABLED": "1 to run Phoenix tracing beside the backend",
    "PHOENIX_IMAGE": "Phoenix OCI image pinned by digest, or a SIF (with PHOENIX_ENABLED=1)",
    "SERVE_KEY_GROUP": "Unix group that may read the keys of the models `haico serve` serves",
}
_LINE = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
# What a shell would expand or run but this reader cannot: ${X:-y}, $(cmd), `cmd`, $1, $$.
_OTHER_EXPANSION = re.compile(r"\$[{(0-9$#?!@*-]|`")


@dataclass(frozen=True)
class ClusterEnv:
    """The parsed file: known keys only, values unquoted as a shell would."""

    path: Path
    values: dict[str, str]

    def get(self, key: str) -> str | None:
        return self.values.get(key) or None


def load_cluster_env(path: Path) -> ClusterEnv:
    """Parse `path`; every problem names the file, the line and the fix."""
    try:  # not waiting on a FIFO: in an allocation that would last until its walltime
        text = read_input_file(path, max_bytes=MAX_CLUSTER_ENV_BYTES).decode("utf-8")
    except (OSError, ValueError) as exc:  # NotAnInputError, UnicodeDecodeError
        raise ConfigError(str(path), "", f"cannot read cluster.env: {exc}") from None
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _LINE.match(stripped)
        where = f"{path}:{number}"
        if match is None:
            raise ConfigError(where, "", f"expected KEY=VALUE, got {stripped[:60]!r}")
        key, raw = match.groups()
        if key not in KNOWN_KEYS:
            valid = ", ".join(sorted(KNOWN_KEYS))
            raise ConfigError(where, key, f"unknown key; valid keys: {valid}")
        try:
            words = shlex.split(raw, comments=True)
        except ValueError as exc:
            raise ConfigError(where, key, f"bad quoting in {raw!r}: {exc}") from None
        if len(words) > 1:
            raise ConfigError(where, key, f'the value has spaces; quote it: {key}="{raw}"')
        value = words[0] if words else ""
        if not value:
            raise ConfigError(where, key, f"empty value; remove the line to leave {key} unset")
        # Sourced by a shell, "$USER/x" expands; '$USER/x' in single quotes does not.
        if not raw.lstrip().startswith("'"):
            value = _expand(value, where=where, key=key, defined=values)
        values[key] = value
    return ClusterEnv(path=path, values=values)


def _expand(value: str, *, where: str, key: str, defined: dict[str, str]) -> str:
    """$NAME and ${NAME} from earlier lines (as `source` sees them), else the environment.

    An unset variable is an error: a shell would make `/scratch/$USER` into `/scratch/`,
    os.path.expandvars leaves a literal `$USER`; both put results where nobody looks.
    """
    if _OTHER_EXPANSION.search(_VARIABLE.sub("", value)):
        raise ConfigError(
            where,
            key,
            f"only $NAME and ${{NAME}} are expanded here; write the value out: {value!r}",
        )

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        found = defined.get(name) or os.environ.get(name)
        if not found:
            raise ConfigError(
                where,
                key,
                f"${name} is not set (or empty) in the environment; set it, or write the value out",
            )
        return found

    return _VARIABLE.sub(substitute, value)
