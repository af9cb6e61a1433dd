"""The sizes and ranges an experiment may have, as plain numbers: `haico`'s argument
parsers read them without loading the models (pydantic) that `config.bounds` builds on."""

from __future__ import annotations

from typing import Final

# Bounds: generous for any real campaign, small enough that a typo (an extra 000) is
# caught at start instead of hanging collection or failing every item at run time.
# Per experiments directory, all arms: 20,000 items collect in 8 s and 160 MB here.
MAX_ITEMS = 100_000
MAX_REPEATS = 1000
MAX_TURNS = 200
MAX_TURN_CHARS = 200_000  # ~50k tokens: a pasted document, below common context windows
MAX_TAGS = 32
MAX_NAME_CHARS = 128
MAX_GPUS = 16  # one node (the stack runs on one node)
MAX_MODEL_LEN = 10_000_000  # the longest published context windows
MAX_TOKENS = 1_000_000
MAX_RECURSION_LIMIT = 1000
MAX_CONCURRENCY = 1024
# The upper bound of concurrency "auto" when the arm sets no `max_concurrency`: the in-flight
# count the local stack was measured at (issue 23).
DEFAULT_MAX_CONCURRENCY = 16
AUTO: Final = "auto"
MAX_TURN_TIMEOUT_S = 86_400  # a day
MAX_LATENCY_MS = 600_000
MAX_LOAD_S = 3600  # a large model from a shared file system takes tens of minutes
MAX_SEED = 2**32 - 1
MAX_RATE_LIMIT_RPM = 100_000
MAX_CPUS = 1024
MAX_ARM_FILE_BYTES = 1024 * 1024  # an arm is a few dozen keys
MAX_CLUSTER_ENV_BYTES = 1024 * 1024  # cluster.env is a few dozen lines
