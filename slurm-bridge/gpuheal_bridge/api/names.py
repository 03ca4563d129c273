"""Validation of the names that end up on a Slurm command line.

Pure functions, shared by the server (422 before anything runs) and the operator's client
(fail fast). Slurm reads ``[``, ``]`` and ``,`` as hostlist syntax, ``=`` and whitespace
split ``scontrol`` arguments, and a leading ``-`` looks like an option, so a single node
name is restricted to letters, digits, ``.``, ``_`` and ``-`` (a Kubernetes node name,
a DNS subdomain, always fits).
"""

from __future__ import annotations

import re

NODE_NAME_MAX = 253
_NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_JOB_RE = re.compile(r"[1-9][0-9]{0,9}")
#: Slurm reserves 0xfffffffe (NO_VAL) and above; job ids are uint32.
JOB_ID_MAX = 0xFFFFFFFD
INCIDENT_PATTERN = r"^[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?$"
SIGNAL_PATTERN = r"^(?:(?:SIG)?(?:USR1|USR2|TERM|INT|HUP|QUIT|CONT|URG|ALRM|PWR|XCPU)|[1-9][0-9]?)$"


class InvalidName(ValueError):
    """A node name or job id that must not reach Slurm; ``str()`` says why."""


def node_name_problem(name: str) -> str | None:  # noqa: PLR0911 - one reason per case
    """Why ``name`` is not a single valid node name, or None when it is."""
    if not name:
        return "empty node name"
    if len(name) > NODE_NAME_MAX:
        return f"node name longer than {NODE_NAME_MAX} characters"
    if _NODE_RE.fullmatch(name):
        return None
    if name[0] in "-._":
        return f"node name must start with a letter or digit, not {name[0]!r}"
    bad = next(c for c in name if not (c.isascii() and (c.isalnum() or c in "._-")))
    if bad in "[],":
        return f"{bad!r} is hostlist syntax: name exactly one node, not a range or list"
    if bad.isspace():
        return "node name contains whitespace"
    return f"node name contains {bad!r}; allowed: letters, digits, '.', '_', '-'"


def validate_node_name(name: str) -> str:
    """Return ``name`` or raise :class:`InvalidName`."""
    problem = node_name_problem(name)
    if problem is not None:
        raise InvalidName(problem)
    return name


def validate_job_id(job_id: str | int) -> int:
    """Return the job id as an int or raise :class:`InvalidName` (arrays ``1_2`` are refused)."""
    text = str(job_id)
    if not _JOB_RE.fullmatch(text):
        if "_" in text:
            raise InvalidName("job array syntax is not accepted: give the task's own job id")
        raise InvalidName("job id must be a positive decimal integer")
    value = int(text)
    if value > JOB_ID_MAX:
        raise InvalidName(f"job id above {JOB_ID_MAX}")
    return value
