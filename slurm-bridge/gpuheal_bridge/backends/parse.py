"""Parsers of Slurm 22.05 output (``scontrol show node -o``, ``sinfo/squeue --json``,
``squeue -o/-O``). Pure functions, tested against output captured from the real Slurm."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gpuheal_bridge.api.models import JobEnd, JobState
from gpuheal_bridge.backends.base import JobProbe, SlurmNode, Unavailable
from gpuheal_bridge.hostlist import expand
from gpuheal_bridge.ownership import split_reason_suffix

_NODE_NAME = re.compile(r"^NodeName=(\S+)")
_STATE = re.compile(r"(?:^| )State=(\S+)")
_BOOT = re.compile(r"(?:^| )BootTime=(\S+)")
_SLURMD_START = re.compile(r"(?:^| )SlurmdStartTime=(\S+)")
#: Columns of the probe format; none of them holds user-controlled free text.
PROBE_FORMAT = "%i|%T|%r|%N"
#: ``squeue -O`` fields of a job (22.05's ``--json`` ignores ``-w``/``-j``, this does not).
#: ``field:|`` prints the value unpadded followed by ``|``; the job name, the only free text,
#: comes last and is split off with everything after the ninth ``|``. ``JobID`` is the raw id
#: (one per array element), as ``job_id`` in ``--json``.
JOB_FIELDS = (
    "JobID", "State", "Reason", "BatchFlag", "Requeue", "RestartCnt", "BatchHost",
    "NodeList", "ReqNodes", "NumNodes", "EndTime", "UserName", "Name",
)  # fmt: skip
JOB_FORMAT = ",".join(f"{f}:|" for f in JOB_FIELDS[:-1]) + f",{JOB_FIELDS[-1]}:"
#: The excluded nodes are not an ``-O`` field in 22.05: ``%x`` of ``squeue -o`` (a hostlist).
EXCLUDED_FORMAT = "%A|%x"


def split_state(text: str) -> tuple[str, tuple[str, ...]]:
    """``"MIXED+DRAIN"`` -> ``("MIXED", ("DRAIN",))``; ``"idle*"`` -> IDLE + NOT_RESPONDING."""
    parts = [p for p in text.upper().split("+") if p]
    if not parts:
        return "UNKNOWN", ()
    base, flags = parts[0], parts[1:]
    for suffix, flag in (("*", "NOT_RESPONDING"), ("~", "POWERED_DOWN"), ("#", "POWERING_UP")):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            flags.append(flag)
    return base, tuple(flags)


def parse_node_line(line: str) -> SlurmNode:
    """One line of ``scontrol show node -o NAME``.

    Values may contain spaces (``OS=Linux 6.1 #1 SMP``) and ``Reason=`` comes last with free
    text ending in ``[user@time]``, so only the fields we need are picked: ``NodeName``
    (first), ``State`` (before the reason) and everything after the first `` Reason=``.
    """
    line = line.strip()
    m = _NODE_NAME.match(line)
    if m is None:
        raise ValueError(f"not a `scontrol show node -o` line: {line[:80]!r}")
    head, sep, reason_text = line.partition(" Reason=")
    s = _STATE.search(head)
    if s is None:
        raise ValueError(f"no State= in node line for {m.group(1)}")
    state, flags = split_state(s.group(1))
    reason = user = when = None
    if sep:
        reason, user, when = split_reason_suffix(reason_text)
        reason = reason or None
    return SlurmNode(
        m.group(1), state, flags, reason, user, when, _time(_BOOT, head), _time(_SLURMD_START, head)
    )


def _time(pattern: re.Pattern[str], head: str) -> str | None:
    m = pattern.search(head)
    return m.group(1) if m and m.group(1) not in ("None", "Unknown") else None


def parse_node_lines(text: str) -> list[SlurmNode]:
    return [parse_node_line(ln) for ln in text.splitlines() if ln.startswith("NodeName=")]


def _check_errors(doc: Mapping[str, Any], what: str) -> None:
    errors = doc.get("errors") or []
    if errors:
        # 22.05's --json exits 0 with an error list and no data when slurmctld is down.
        first = errors[0] if isinstance(errors[0], Mapping) else {"error": str(errors[0])}
        text = first.get("description") or first.get("error") or "unknown error"
        raise Unavailable(f"{what}: {text} ({first.get('error', '')})".strip())


def _iso(epoch: Any) -> str | None:
    """Local time without zone, as ``scontrol show node`` prints it (same value either way)."""
    if isinstance(epoch, int) and epoch > 0:
        return datetime.fromtimestamp(epoch).isoformat(timespec="seconds")
    return None


def node_from_json(item: Mapping[str, Any]) -> SlurmNode:
    """One entry of ``sinfo --json`` / slurmrestd v0.0.38 ``nodes``."""
    raw_state = item.get("state")
    if isinstance(raw_state, list):  # v0.0.39+: state is a list of flags, base first
        state, flags = (str(raw_state[0]).upper(), tuple(str(f).upper() for f in raw_state[1:]))
    else:
        state, flags = split_state(str(raw_state or "unknown"))
    flags = flags + tuple(str(f).upper() for f in item.get("state_flags") or () if f not in flags)
    # 22.05's JSON says "allocated" for a partly used node that scontrol calls MIXED; so does
    # 26.05's v0.0.45, which names its idle CPUs alloc_idle_cpus.
    idle = item.get("idle_cpus", item.get("alloc_idle_cpus"))
    if state == "ALLOCATED" and int(idle or 0) > 0:
        state = "MIXED"
    reason = item.get("reason") or None
    return SlurmNode(
        name=str(item["name"]),
        state=state,
        flags=flags,
        reason=reason,
        reason_user=item.get("reason_set_by_user") or None,
        reason_time=_iso(_number(item.get("reason_changed_at"))),  # v0.0.45: {set, number}
        boot_time=_iso(_number(item.get("boot_time"))),
        slurmd_start_time=_iso(_number(item.get("slurmd_start_time"))),
    )


def parse_nodes_json(doc: Mapping[str, Any]) -> list[SlurmNode]:
    _check_errors(doc, "sinfo --json")
    return [node_from_json(n) for n in doc.get("nodes") or []]


def _number(value: Any) -> int:
    if isinstance(value, Mapping):  # v0.0.39+: {"set": true, "number": 3}
        return int(value.get("number") or 0)
    return int(value or 0)


def _text_state(value: Any) -> str:
    if isinstance(value, list):  # v0.0.40+: job_state is a list
        return str(value[0]).upper() if value else "UNKNOWN"
    return str(value or "UNKNOWN").upper()


#: Final job states -> how the job ended (``squeue --json`` keeps finished jobs for MinJobAge).
ENDED_STATES: Mapping[str, JobEnd] = {
    "COMPLETED": JobEnd.COMPLETED,
    "FAILED": JobEnd.FAILED,
    "NODE_FAIL": JobEnd.NODE_FAIL,
    "CANCELLED": JobEnd.CANCELLED,
    "TIMEOUT": JobEnd.TIMEOUT,
    "OUT_OF_MEMORY": JobEnd.OUT_OF_MEMORY,
    "PREEMPTED": JobEnd.PREEMPTED,
    "BOOT_FAIL": JobEnd.BOOT_FAIL,
    "DEADLINE": JobEnd.DEADLINE,
    "SPECIAL_EXIT": JobEnd.OTHER,
    "REVOKED": JobEnd.OTHER,
}


def _nodes(value: Any) -> list[str]:
    if isinstance(value, str):
        return expand(value)
    return [str(n) for n in value or []]


def exit_parts(value: Any) -> tuple[int | None, int | None]:
    """``exit_code`` -> (exit status, signal). 22.05 gives the raw wait status (``256`` is
    exit 1, ``9`` is SIGKILL); v0.0.39+ an object ``{"return_code": .., "signal": {"id": ..}}``."""
    if isinstance(value, Mapping):
        status = _number(value.get("return_code"))
        sig = value.get("signal") or {}
        signal = _number(sig.get("id") if isinstance(sig, Mapping) else sig)
        return status, (signal or None)
    if value is None or isinstance(value, bool):
        return None, None
    raw = int(value)
    if raw & 0x7F:
        return None, raw & 0x7F
    return (raw >> 8) & 0xFF, None


def job_from_json(item: Mapping[str, Any]) -> JobState:
    """One entry of ``squeue --json`` / slurmrestd ``jobs``."""
    excluded = item.get("excluded_nodes")
    reason = item.get("state_reason")
    state = _text_state(item.get("job_state"))
    ended = ENDED_STATES.get(state)
    status, signal = exit_parts(item.get("exit_code")) if ended is not None else (None, None)
    end = _number(item.get("end_time")) if ended is not None else 0
    count = _number(item.get("node_count"))
    return JobState(
        job_id=int(item["job_id"]),
        name=item.get("name") or None,
        user=item.get("user_name") or None,
        state=state,
        reason=None if reason in (None, "", "None") else str(reason),
        nodes=expand(item.get("nodes") or ""),
        batch_host=item.get("batch_host") or None,
        batch=bool(item.get("batch_flag")),
        requeue=bool(item.get("requeue")),
        restart_count=_number(item.get("restart_cnt")),
        excluded_nodes=_nodes(excluded),
        required_nodes=_nodes(item.get("required_nodes")),
        node_count=count or None,
        ended=ended,
        end_time=datetime.fromtimestamp(end, tz=UTC) if end > 0 else None,
        exit_status=status,
        exit_signal=signal,
    )


def parse_jobs_json(doc: Mapping[str, Any], gpus_on: str | None = None) -> list[JobState]:
    """The jobs of ``squeue --json`` / slurmrestd; with ``gpus_on`` each with the GPUs it
    holds on that node (`with_gpus_from_json`)."""
    _check_errors(doc, "squeue --json")
    items = doc.get("jobs") or []
    if gpus_on is None:
        return [job_from_json(j) for j in items]
    return [with_gpus_from_json(j, job_from_json(j), gpus_on) for j in items]


def _none(text: str) -> str | None:
    return None if text in ("", "None", "(null)", "n/a") else text


def parse_excluded_lines(text: str) -> dict[int, list[str]]:
    """``squeue -h -o EXCLUDED_FORMAT`` -> job id -> excluded nodes (expanded)."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, sep, hosts = line.strip().partition("|")
        if not sep:
            raise ValueError(f"unexpected squeue line {line!r}")
        out[int(job_id)] = expand(_none(hosts) or "")
    return out


def parse_job_lines(text: str, excluded: Mapping[int, list[str]] | None = None) -> list[JobState]:
    """``squeue -h -O JOB_FORMAT`` (plus the excluded nodes by job id) -> jobs, the same
    ``JobState`` that ``job_from_json`` makes of ``squeue --json``."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.rstrip("\n").split("|", len(JOB_FIELDS) - 1)
        if len(parts) != len(JOB_FIELDS):
            raise ValueError(f"unexpected squeue line {line!r}")
        job_id, state, reason, batch, requeue, restarts, host, nodes, req, count, end = parts[:11]
        user, name = parts[11:]
        jid = int(job_id)
        state = state.strip().upper() or "UNKNOWN"
        ended = ENDED_STATES.get(state)
        jobs.append(
            JobState(
                job_id=jid,
                name=name or None,
                user=_none(user),
                state=state,
                reason=_none(reason),
                nodes=expand(_none(nodes) or ""),
                batch_host=_none(host),
                batch=batch.strip() == "1",
                requeue=requeue.strip() == "1",
                restart_count=int(restarts or 0),
                excluded_nodes=list((excluded or {}).get(jid, [])),
                required_nodes=expand(_none(req) or ""),
                node_count=int(count) if count.strip().isdigit() and int(count) else None,
                ended=ended,
                end_time=_local_time(end) if ended is not None else None,
            )
        )
    return jobs


def _local_time(text: str) -> datetime | None:
    """``2026-11-23T14:48:24`` as squeue prints it (the host's local time) -> aware UTC."""
    value = _none(text.strip())
    if value is None or value in ("Unknown", "N/A"):
        return None
    try:
        return datetime.fromisoformat(value).astimezone(UTC)
    except ValueError:
        return None


_EXIT_CODE = re.compile(r"(?:^|\s)ExitCode=(\d+):(\d+)")


def parse_exit_code(show_job: str) -> tuple[int | None, int | None]:
    """``ExitCode=0:9`` of ``scontrol show job -o`` -> (exit status, signal)."""
    m = _EXIT_CODE.search(show_job)
    if m is None:
        return None, None
    status, signal = int(m.group(1)), int(m.group(2))
    return (None, signal) if signal else (status, None)


def _gres_entries(detail: str) -> list[str]:
    """``gpu:a100:1(IDX:0,2),gpu:h100:1(IDX:5)`` -> its entries (commas inside the
    parentheses belong to the index list)."""
    entries: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in detail:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            entries.append("".join(current))
            current = []
        else:
            current.append(ch)
    entries.append("".join(current))
    return [e for e in entries if e]


_GPU_ENTRY = re.compile(r"^gpu(?::[^:()]+)?(?::\d+)?\(IDX:([^)]*)\)$")
_INDEX_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def gpu_indexes(detail: str) -> list[int] | None:
    """One node's GRES allocation of a job (``gpu:4(IDX:0-3)``, ``gpu:a100:2(IDX:0,2)``,
    several types joined by commas, ``""`` for none; the GRES= of ``scontrol show job -d``,
    an item of slurmrestd's ``gres_detail``) -> the GPU indexes, sorted; [] when it holds no
    GPU; None when a GPU entry carries no index (``IDX:N/A``, an unknown shape)."""
    held: set[int] = set()
    for entry in _gres_entries(detail.strip()):
        if not (entry == "gpu" or entry.startswith(("gpu:", "gpu("))):
            continue  # another GRES (shard, mps, nic): not a GPU
        m = _GPU_ENTRY.match(entry)
        if m is None:
            return None
        for part in m.group(1).split(","):
            r = _INDEX_RANGE.match(part)
            if r is None:
                return None
            lo = int(r.group(1))
            held.update(range(lo, int(r.group(2) or lo) + 1))
    return sorted(held)


#: A node's line of ``scontrol show job -d`` (not ``-o``): indented, on its own line, right
#: after the ``JOB_GRES=`` line (Slurm 22.05 and 26.05 print the same).
_JOB_GRES_LINE = re.compile(r"^\s+JOB_GRES=")
_NODE_DETAIL_LINE = re.compile(r"^\s+Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)\s*$")


def parse_job_gpus(show_job: str, node: str) -> list[int] | None:
    """``scontrol show job -d ID`` -> the GPU indexes the job holds on ``node`` (see
    `gpu_indexes`); None when the output has no line for the node.

    The multi-line form, not ``-o``: there the job's free text (name, comment, command)
    shares the line with the node details. Only the indented lines that follow the first
    ``JOB_GRES=`` line are read; a job whose name forged such lines could only misreport
    its own GPUs, since each job's detail is read from its own output."""
    lines = show_job.splitlines()
    start = next((i for i, line in enumerate(lines) if _JOB_GRES_LINE.match(line)), None)
    if start is None:
        return None
    for line in lines[start + 1 :]:
        m = _NODE_DETAIL_LINE.match(line)
        if m is None:
            break
        if node in expand(m.group(1)):
            return gpu_indexes(m.group(2))
    return None


def with_gpus_from_json(item: Mapping[str, Any], job: JobState, node: str) -> JobState:
    """``job`` with ``gpus`` on ``node`` from slurmrestd's ``gres_detail`` (one item per node
    of the allocation, in the order of its node list; v0.0.38 to v0.0.45 alike)."""
    detail = item.get("gres_detail")
    if not isinstance(detail, list) or node not in job.nodes:
        return job
    if not detail:
        return job.model_copy(update={"gpus": []})
    at = job.nodes.index(node)
    if len(detail) != len(job.nodes) or not isinstance(detail[at], str):
        return job
    return job.model_copy(update={"gpus": gpu_indexes(detail[at])})


#: States in which a job still holds (or is releasing) its nodes.
ACTIVE_STATES = frozenset(
    {"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED", "SIGNALING", "STAGE_OUT"}
)


def jobs_on(jobs: list[JobState], node: str) -> list[JobState]:
    """The jobs that hold ``node`` now (what ``squeue -w`` listed, or a full JSON listing)."""
    return [j for j in jobs if node in j.nodes and j.state in ACTIVE_STATES]


def ended_on(jobs: list[JobState], node: str, since: datetime) -> list[JobState]:
    """Jobs that ran on ``node`` and ended at or after ``since`` (while slurmctld still holds
    them: MinJobAge after their end, 300 s by default)."""
    return [
        j
        for j in jobs
        if node in j.nodes and j.ended is not None and j.end_time is not None
        and j.end_time >= since
    ]  # fmt: skip


def parse_probe_line(line: str) -> JobProbe:
    """``1|PENDING|BeginTime|`` (``squeue -h -t all -j ID -o PROBE_FORMAT``)."""
    parts = line.strip().split("|")
    if len(parts) != 4:
        raise ValueError(f"unexpected squeue line {line!r}")
    job_id, state, reason, nodes = parts
    return JobProbe(
        job_id=int(job_id),
        state=state.upper(),
        reason=None if reason in ("", "None") else reason,
        nodes=expand(nodes),
    )
