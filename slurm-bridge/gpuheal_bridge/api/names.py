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
#: A single node name, as the OpenAPI document shows it (``node_name_problem`` gives the
#: reason; a unit test keeps the two in agreement).
NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_NODE_RE = re.compile(NODE_NAME_PATTERN.strip("^$"))
_JOB_RE = re.compile(r"[1-9][0-9]{0,9}")
#: Slurm reserves 0xfffffffe (NO_VAL) and above; job ids are uint32.
JOB_ID_MAX = 0xFFFFFFFD
#: Exactly the decimal numbers 1..JOB_ID_MAX (4294967293), no sign, no leading zero.
JOB_ID_PATTERN = (
    r"^(?:[1-9][0-9]{0,8}|[1-3][0-9]{9}|4[01][0-9]{8}|42[0-8][0-9]{7}|429[0-3][0-9]{6}"
    r"|4294[0-8][0-9]{5}|42949[0-5][0-9]{4}|429496[0-6][0-9]{3}|4294967[01][0-9]{2}"
    r"|42949672[0-8][0-9]|429496729[0-3])$"
)
INCIDENT_PATTERN = r"^[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?$"
#: Signals a job can catch, so it can checkpoint (KILL and STOP cannot be caught: a job dies
#: or freezes without one). By name (the operator's policies use names), or by the number
#: Linux gives them on x86-64, arm64, riscv and most other architectures: HUP 1, INT 2,
#: QUIT 3, USR1 10, USR2 12, ALRM 14, TERM 15, CONT 18, URG 23, XCPU 24, PWR 30. 9 (KILL) and
#: 19 (STOP) are refused, like every other number.
CATCHABLE_SIGNALS = (
    "USR1",
    "USR2",
    "TERM",
    "INT",
    "HUP",
    "QUIT",
    "CONT",
    "URG",
    "ALRM",
    "PWR",
    "XCPU",
)
CATCHABLE_SIGNAL_NUMBERS = (1, 2, 3, 10, 12, 14, 15, 18, 23, 24, 30)
SIGNAL_PATTERN = (
    f"^(?:(?:SIG)?(?:{'|'.join(CATCHABLE_SIGNALS)})"
    f"|{'|'.join(str(n) for n in CATCHABLE_SIGNAL_NUMBERS)})$"
)
#: XIDs the bridge takes: the operator's own bound (``gpuheal.xid.parse.MAX_XID``, the
#: NodeRemediation's ``xid``), so every incident the operator can open can drain its node.
#: NVIDIA's codes are below 200 today and new drivers add new ones; 0 is not an XID.
XID_MIN, XID_MAX = 1, 65535
#: Every drain the bridge sets carries this prefix; a reason without it belongs to someone else.
REASON_PREFIX = "gpuheal:"
#: A drain reason a caller chooses (the reserve pool's): one line without control characters
#: (`scontrol show node` prints the reason as a line of its own, and the bridge reads it line
#: by line), no ``[``/``]`` (Slurm appends ``[user@time]``), and not starting with gpuheal's
#: prefix (the pool's drain would read as an incident's, and be lifted as one).
DRAIN_REASON_MAX = 128
# C1 controls (\x80-\x9f) too, and at least one character that is not a space: the validator
# strips the reason (Python's str.strip(), \x85 included) and refuses what is left empty. No
# lookahead: the CRD's CEL (RE2) checks the same pattern.
_REASON_CHAR = r"[^\[\]\x00-\x1f\x7f-\x9f]"
DRAIN_REASON_PATTERN = rf"^{_REASON_CHAR}*[^\s\[\]\x00-\x1f\x7f-\x9f]{_REASON_CHAR}*$"
OWN_REASON_PATTERN = r"^\s*gpuheal:"
_DRAIN_REASON_RE = re.compile(DRAIN_REASON_PATTERN)
_OWN_REASON_RE = re.compile(OWN_REASON_PATTERN)


def drain_reason_problem(reason: str) -> str | None:
    """Why ``reason`` cannot be a caller's drain reason, or None."""
    if not reason.strip():
        return "must not be empty"
    if len(reason) > DRAIN_REASON_MAX:
        return f"must be at most {DRAIN_REASON_MAX} characters"
    if not _DRAIN_REASON_RE.match(reason):
        return "must be one line without control characters, '[' or ']' (Slurm appends [user@time])"
    if _OWN_REASON_RE.match(reason):
        return f"must not start with {REASON_PREFIX!r}: that prefix marks gpuheal's own drains"
    return None


#: An ``Idempotency-Key``: 1-200 printable ASCII characters.
IDEMPOTENCY_KEY_MAX = 200
IDEMPOTENCY_KEY_PATTERN = r"^[\x20-\x7e]+$"


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
