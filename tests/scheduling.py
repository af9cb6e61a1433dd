"""How `pytest -n N` hands this suite's tests to xdist's workers (conftest.py installs it).

A session fixture starts once per worker, and a module's fixture once per worker that runs
one of its tests. So the unit of work is a whole module, except for the folders whose tests
share a session resource that must start once: the stand-in fleet that tests/standins and
tests/gates ask of tests/conftest.py's launcher, and the real vLLMs of tests/vllm. The
modules of tests/slurm are units of their own: each worker that runs one starts its own
private cluster (tests/slurm/cluster.py: own directory, munge key and ports; a job is
found by its SLURM_CONF as well as its id, as two clusters number their jobs alike), so
the Slurm tests, which mostly wait for time limits and signals, wait side by side rather
than one after the other. Units go out in collection order, which conftest.py sorts longest
first: the real-vLLM tier, the Slurm tests, then the other slow ones.

(xdist's own `--dist loadgroup` would do this from `xdist_group` marks, but pytest 9.2's
structured node ids break it: pytest-xdist#1386.)
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

# tests/<folder>/ -> the unit of all its tests
SHARED_FOLDERS = {"standins": "stand-ins", "gates": "stand-ins", "vllm": "vllm"}


class SharedResourceScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's loadscope scheduling with this suite's units, in collection order."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)
        # loadscope would hand out the units with the most tests first; conftest.py's order
        # puts the longest ones first.
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        parts = path.split("/")
        if len(parts) > 2 and parts[0] == "tests" and parts[1] in SHARED_FOLDERS:
            return SHARED_FOLDERS[parts[1]]
        return path
