"""The primary backend: Slurm's own commands (scontrol, squeue, scancel, sinfo).

Every call is an argument list run without a shell, bounded by a timeout (the process is
killed when it expires), with ``SLURM_CONF`` and PATH from the configuration. Every read
names its node or job, so slurmctld answers for that one only (never a dump of the whole
queue): ``scontrol show node -o NODE`` parsed as text (no ``--json`` in 22.05); jobs with
``squeue -w NODE`` or ``squeue -j ID`` and fixed ``-O`` fields (22.05's ``--json`` ignores
``-w/-j/-t``, so it is not used), their excluded nodes with ``-o '%A|%x'``; and
``squeue -j ID -t all -o '%i|%T|%r|%N'`` for cheap state polling (no free-text columns).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuheal_bridge.api.models import JobState, SignalTarget
from gpuheal_bridge.backends.base import (
    ALL_CAPABILITIES,
    BackendError,
    Capability,
    JobProbe,
    Nodes,
    NotFound,
    Ping,
    SlurmNode,
    Unavailable,
    error_for,
)
from gpuheal_bridge.backends.parse import (
    EXCLUDED_FORMAT,
    JOB_FORMAT,
    PROBE_FORMAT,
    ended_on,
    jobs_on,
    parse_excluded_lines,
    parse_exit_code,
    parse_job_gpus,
    parse_job_lines,
    parse_node_lines,
    parse_probe_line,
)

# Measured on 22.05: slurmctld down gives "Unable to contact slurm controller (connect
# failure)" after ~4 s, and `scontrol requeue` says "Unexpected message received".
_UNAVAILABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Zero Bytes were transmitted"
    r"|Connection refused|Unexpected message received|backup controller in standby"
    r"|Communication connection failure|Slurm controller not responding",
    re.I,
)
# "Invalid job id specified" from scontrol; squeue 22.05 says "Invalid job id: N" for an id
# above 2**31 - 1 (it parses into a signed int), which no job it can show has.
_NOT_FOUND = re.compile(
    r"Invalid node name|Node \S+ not found|Invalid job id|Unable to find JobId", re.I
)


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def message(self) -> str:
        return (self.stderr.strip() or self.stdout.strip() or f"exit {self.returncode}")[:500]


def job_node_args(excluded: list[str] | None, required: list[str] | None) -> list[str]:
    """``scontrol update JobId=..`` arguments: ``ExcNodeList=a,b`` when ``excluded`` is given,
    ``ReqNodeList=..`` when ``required`` is given (``ReqNodeList=`` clears it)."""
    args = [] if excluded is None else [f"ExcNodeList={','.join(excluded)}"]
    if required is not None:
        args.append(f"ReqNodeList={','.join(required)}")
    return args


_KILL_WAIT = re.compile(r"^KillWait\s*=\s*(\d+)", re.M)


def parse_kill_wait(text: str) -> float | None:
    """``KillWait                = 30 sec`` in ``scontrol show config``."""
    m = _KILL_WAIT.search(text)
    return float(m.group(1)) if m else None


def classify_failure(result: CommandResult) -> BackendError:
    """Map a failed Slurm command to NotFound / Unavailable / Rejected by its message."""
    return error_for(
        result.message,
        text=f"{result.stderr}\n{result.stdout}",
        unavailable=_UNAVAILABLE,
        not_found=_NOT_FOUND,
    )


class CliBackend:
    """Slurm through its command-line tools (the only backend that can do everything on 22.05)."""

    name = "cli"

    def __init__(
        self,
        *,
        slurm_conf: str | None = None,
        bin_dir: str | None = None,
        timeout: float = 15.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.timeout = timeout
        self._bin_dir = bin_dir
        base = dict(os.environ if env is None else env)
        if slurm_conf:
            base["SLURM_CONF"] = slurm_conf
        self._env = base
        self._version: str | None = None

    def capabilities(self) -> frozenset[Capability]:
        return ALL_CAPABILITIES

    def _exe(self, tool: str) -> str:
        return os.path.join(self._bin_dir, tool) if self._bin_dir else tool

    async def run(self, tool: str, *args: str, limit: float | None = None) -> CommandResult:
        """Run ``tool args...`` (no shell); raise Unavailable on timeout or a missing tool."""
        argv = (self._exe(tool), *args)
        limit = self.timeout if limit is None else limit
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
            )
        except OSError as exc:
            raise Unavailable(f"cannot run {argv[0]}: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), limit)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await proc.wait()
            raise Unavailable(f"{tool} {' '.join(args[:2])} timed out after {limit:g}s") from None
        return CommandResult(
            argv, proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
        )

    async def _ok(self, tool: str, *args: str) -> CommandResult:
        result = await self.run(tool, *args)
        # scontrol/scancel can print an error yet exit 0 (e.g. some job updates): look at both.
        if result.returncode != 0 or re.search(r"\berror\b", result.stderr, re.I):
            raise classify_failure(result)
        return result

    async def ping(self) -> Ping:
        result = await self.run("scontrol", "ping")
        text = result.stdout.strip() or result.stderr.strip()
        up = bool(re.search(r"\bis UP\b", text))
        if self._version is None:
            with contextlib.suppress(BackendError):
                ver = await self.run("scontrol", "--version")
                m = re.search(r"(\d+\.\d+\.\d+)", ver.stdout)
                self._version = m.group(1) if m else None
        return Ping(
            up=up, detail=text.splitlines()[0] if text else "no answer", version=self._version
        )

    async def get_node(self, node: str) -> SlurmNode:
        result = await self._ok("scontrol", "show", "node", "-o", node)
        nodes = [n for n in parse_node_lines(result.stdout) if n.name == node]
        if not nodes:
            raise NotFound(f"Node {node} not found")
        return nodes[0]

    async def _jobs(self, *selector: str) -> list[JobState]:
        """The jobs ``squeue -h -t all SELECTOR`` lists (``-w NODE`` or ``-j ID``): two
        filtered calls at once, the fields and the excluded nodes."""
        fields, excluded = await asyncio.gather(
            self._ok("squeue", "-h", "-t", "all", *selector, "-O", JOB_FORMAT),
            self._ok("squeue", "-h", "-t", "all", *selector, "-o", EXCLUDED_FORMAT),
        )
        try:
            return parse_job_lines(fields.stdout, parse_excluded_lines(excluded.stdout))
        except ValueError as exc:
            raise Unavailable(f"squeue gave unexpected output: {exc}") from exc

    async def jobs_on_node(self, node: str, *, gpus: bool = False) -> list[JobState]:
        """With ``gpus``: one ``scontrol show job -d ID`` per job (squeue 22.05 has no field
        with the GRES indexes); a job that ended meanwhile keeps ``gpus`` None."""
        jobs = jobs_on(await self._jobs("-w", node), node)
        if not gpus:
            return jobs
        shown = await asyncio.gather(
            *(self.run("scontrol", "show", "job", "-d", str(j.job_id)) for j in jobs)
        )
        return [
            job.model_copy(update={"gpus": parse_job_gpus(result.stdout, node)})
            if result.returncode == 0
            else job
            for job, result in zip(jobs, shown, strict=True)
        ]

    async def ended_jobs_on_node(self, node: str, since: dt.datetime) -> list[JobState]:
        """``squeue -t all -w NODE`` lists the jobs that ended there too (while slurmctld
        holds them); their exit (not an ``-O`` field in 22.05) from ``scontrol show job``."""
        ended = ended_on(await self._jobs("-w", node), node, since)
        shown = await asyncio.gather(
            *(self._ok("scontrol", "show", "job", "-o", str(j.job_id)) for j in ended)
        )
        out = []
        for job, result in zip(ended, shown, strict=True):
            status, signal = parse_exit_code(result.stdout)
            out.append(job.model_copy(update={"exit_status": status, "exit_signal": signal}))
        return out

    async def kill_wait(self) -> float | None:
        result = await self._ok("scontrol", "show", "config")
        return parse_kill_wait(result.stdout)

    async def get_job(self, job_id: int) -> JobState:
        for job in await self._jobs("-j", str(job_id)):
            if job.job_id == job_id:
                return job
        raise NotFound(f"Invalid job id specified: {job_id}")

    async def probe_job(self, job_id: int) -> JobProbe:
        result = await self._ok("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", PROBE_FORMAT)
        lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
        if not lines:
            raise NotFound(f"Invalid job id specified: {job_id}")
        return parse_probe_line(lines[0])

    async def drain(self, node: str, reason: str) -> None:
        await self._ok("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    async def resume(self, node: str) -> None:
        await self._ok("scontrol", "update", f"NodeName={node}", "State=RESUME")

    async def reboot(self, node: str, reason: str, *, asap: bool, resume: bool) -> None:
        flags = [*(["ASAP"] if asap else []), *(["nextstate=RESUME"] if resume else [])]
        await self._ok("scontrol", "reboot", *flags, f"reason={reason}", node)

    async def set_down(self, node: str, reason: str) -> None:
        await self._ok("scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={reason}")

    async def requeue(self, job_id: int, hold: bool) -> None:
        await self._ok("scontrol", "requeuehold" if hold else "requeue", str(job_id))

    async def signal(self, job_id: int, signal: str, target: SignalTarget) -> None:
        args: Sequence[str] = {
            SignalTarget.FULL: ("--full",),
            SignalTarget.BATCH: ("--batch",),
            SignalTarget.STEPS: (),
        }[target]
        await self._ok("scancel", f"--signal={signal}", *args, str(job_id))

    async def set_excluded_nodes(
        self, job_id: int, nodes: list[str], required_nodes: Nodes = None
    ) -> None:
        await self._ok(
            "scontrol", "update", f"JobId={job_id}", *job_node_args(nodes, required_nodes)
        )

    async def start_now(
        self, job_id: int, excluded_nodes: Nodes = None, required_nodes: Nodes = None
    ) -> None:
        args = job_node_args(excluded_nodes or None, required_nodes)
        await self._ok("scontrol", "update", f"JobId={job_id}", *args, "StartTime=now")

    async def aclose(self) -> None:
        return None
