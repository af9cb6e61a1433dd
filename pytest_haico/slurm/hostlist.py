"""Slurm host lists (``node[01-03,07],gpu5``) expanded into node names, and this host's names."""

from __future__ import annotations

import itertools
import re
import socket
from collections.abc import Mapping

from pytest_haico.slurm import client

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
# Bounds a typo such as node[1-99999999] from allocating a list that large.
_MAX_HOSTS = 100_000


def expand_hostlist(text: str) -> list[str]:
    """The node names of a Slurm host list, in order, as ``scontrol show hostnames`` prints them.

    Commas outside brackets separate hosts; each bracket holds comma-separated numbers and
    ranges ``lo-hi``, zero-padded to the width of ``lo``; several brackets in one host
    multiply (``rack[1-2]-n[1-2]``). Raises `ValueError` for anything else.
    """
    hosts: list[str] = []
    for expression in _split_top_level(text.strip()):
        hosts += _expand_one(expression)
        if len(hosts) > _MAX_HOSTS:
            raise ValueError(f"host list {text!r} names more than {_MAX_HOSTS} hosts")
    if not hosts:
        raise ValueError("the host list is empty")
    return hosts


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets in host list {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append("".join(current))
    if any(not part for part in parts):
        raise ValueError(f"empty host name in host list {text!r}")
    return parts


def _expand_one(expression: str) -> list[str]:
    pieces = re.split(r"\[([^\]]*)\]", expression)
    # pieces alternates: literal, bracket, literal, bracket, ..., literal
    choices = [
        [piece] if i % 2 == 0 else _expand_ranges(piece, expression)
        for i, piece in enumerate(pieces)
    ]
    return ["".join(combination) for combination in itertools.product(*choices)]


def _expand_ranges(body: str, expression: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if match is None:
            raise ValueError(f"invalid range {item!r} in host list {expression!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f"invalid range {item!r} in host list {expression!r}")
        if int(high) - int(low) >= _MAX_HOSTS:
            raise ValueError(f"range {item!r} in host list {expression!r} is too large")
        values += [str(number).zfill(len(low)) for number in range(int(low), int(high) + 1)]
    return values


def node_names(nodelist: str, environ: Mapping[str, str]) -> list[str]:
    """The nodes of `nodelist`: from ``scontrol show hostnames`` when it answers (Slurm's own
    reading of every syntax it accepts), else from `expand_hostlist`.

    Raises `ValueError` when neither can read the list.
    """
    argv = ["scontrol", "show", "hostnames", nodelist]
    try:
        shown = client.run(argv, environ=environ, timeout_s=client.IN_JOB_TIMEOUT_S)
    except client.SlurmError:
        shown = None
    # An invalid list makes scontrol print an error and nothing else, with status 0.
    if shown is not None and shown.ok and shown.stdout.strip():
        return shown.stdout.split()
    return expand_hostlist(nodelist)


def this_host_names(environ: Mapping[str, str], hostname: str | None = None) -> set[str]:
    """The names this host may have in a node list: its host name, full and short, and
    ``SLURMD_NODENAME`` (slurmd sets it only in processes it started on its own node).

    No DNS look-up (`socket.getfqdn` can hang for seconds on a cluster's resolver).
    """
    hostname = socket.gethostname() if hostname is None else hostname
    names = {hostname, hostname.split(".")[0]}
    slurmd_name = environ.get("SLURMD_NODENAME")
    if slurmd_name:
        names.add(slurmd_name)
    return {name for name in names if name}
