"""slurmrestd backend: reads on every version, writes only where the API has them.

What the connected slurmrestd can do decides :meth:`RestBackend.capabilities`, per API
version (the newest the connected slurmrestd offers):

- read nodes, jobs, ping: every version.
- drain / resume: v0.0.39+ (23.02+), ``POST /slurm/vX/node/{name}``
  ``{"state": ["DRAIN"], "reason": ...}``; 22.05's v0.0.38 answers 405.
- signal: the steps on every version; the batch step or the whole job (``flags``) from v0.0.40.
- requeue / requeuehold: v0.0.45 (26.05) only, ``GET /slurm/v0.0.45/job/{id}/requeue``
  (``?Hold=true`` for requeuehold).
- ExcNodeList, ReqNodeList, StartTime: v0.0.45, ``POST /slurm/v0.0.45/job/{id}`` with
  ``excluded_nodes``, ``required_nodes``, ``begin_time`` (earlier versions: the fallback).
- reboot: none (no REST endpoint in any version).

Operations the API lacks raise :class:`~gpuheal_bridge.backends.base.Unsupported` (HTTP 501
from the bridge), or go to an optional ``fallback`` backend (the CLI backend next to
slurmctld): ``--backend rest --rest-write-fallback cli`` reads over REST and writes with
scontrol. Nothing pretends: ``/readyz`` lists the capabilities actually available.

Transport: ``http(s)://host:port`` with JWT headers (``X-SLURM-USER-NAME``,
``X-SLURM-USER-TOKEN``) or ``unix:/path/slurmrestd.sock`` (``rest_auth/local``).
22.05 answers an unknown node or job with HTTP 500 and an ``errors`` list: mapped to NotFound.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gpuheal_bridge.api.models import JobState, SignalTarget
from gpuheal_bridge.backends.base import (
    Backend,
    Capability,
    JobProbe,
    Nodes,
    NotFound,
    Ping,
    Rejected,
    SlurmNode,
    Unavailable,
    Unsupported,
    error_for,
)
from gpuheal_bridge.backends.parse import ended_on, jobs_on, node_from_json, parse_jobs_json

_VERSION = re.compile(r"^/slurm/(v0\.0\.(\d+))/")
_NOT_FOUND = re.compile(r"Invalid (node name|job id)|Unable to find|not found", re.I)
_DOWN = re.compile(r"Unable to contact slurm controller|Unspecified error|connect failure", re.I)
READ_CAPS = frozenset({Capability.READ_NODES, Capability.READ_JOBS})
#: The first API with a requeue endpoint (26.05; checked against its slurmrestd's OpenAPI).
REQUEUE_MINOR = 45
log = logging.getLogger("gpuheal_bridge")


def minor(version: str) -> int:
    """``"v0.0.40"`` -> 40."""
    return int(version.rsplit(".", 1)[1])


def node_update_body(minor_version: int, state: str, reason: str | None) -> dict[str, Any]:
    """Request body of ``POST /slurm/v0.0.N/node/{name}`` (N >= 39): state is a flag list."""
    if minor_version < 39:
        raise Unsupported(f"slurmrestd v0.0.{minor_version} cannot update nodes")
    body: dict[str, Any] = {"state": [state]}
    if reason is not None:
        body["reason"] = reason
    return body


def job_update_body(excluded: Nodes, required: Nodes) -> dict[str, Any]:
    """Body of ``POST /slurm/v0.0.45/job/{id}``: ``excluded_nodes`` when ``excluded`` is given,
    ``required_nodes`` when ``required`` is given; ``[]`` clears that list, as ``ExcNodeList=``
    does with scontrol. Seen on 26.05.5: an empty array leaves the list as it was, an empty
    string clears it, so an empty list is sent as ``""``."""
    body: dict[str, Any] = {}
    if excluded is not None:
        body["excluded_nodes"] = excluded or ""
    if required is not None:
        body["required_nodes"] = required or ""
    return body


def signal_params(minor_version: int, signal: str, target: SignalTarget) -> dict[str, str]:
    """Query of ``DELETE /slurm/v0.0.N/job/{id}`` that sends ``signal`` to ``target``."""
    sig = signal if signal.isdigit() or signal.startswith("SIG") else f"SIG{signal}"
    if target is SignalTarget.STEPS:
        return {"signal": sig}
    if minor_version < 40:
        raise Unsupported(f"slurmrestd v0.0.{minor_version} cannot signal the batch step")
    flag = "FULL_JOB" if target is SignalTarget.FULL else "BATCH_JOB"
    return {"signal": sig, "flags": flag}


class JwtFile:
    """The slurmrestd JWT in a file, read again whenever the file changes (its inode, mtime or
    size: a Secret volume swaps a symlink, ``scontrol token`` rewrites the file): a rotated
    JWT is used from the next call on, nothing restarts. One ``stat`` per call; if the file
    cannot be read for a moment, the last JWT stays (and the failure is logged once)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""
        self._failing = False
        self._read(strict=True)

    def _read(self, *, strict: bool = False) -> str:
        try:
            st = self.path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                self._token, self._stamp = self.path.read_text().strip(), stamp
                if not strict:
                    log.warning("slurmrestd JWT read again from %s (it changed)", self.path)
            self._failing = False
        except OSError as exc:
            if strict:
                raise
            if not self._failing:
                log.error("slurmrestd JWT %s unreadable, the last one stays: %s", self.path, exc)
            self._failing = True
        return self._token

    def __call__(self) -> str:
        return self._read()


class RestBackend:
    name = "rest"

    def __init__(
        self,
        url: str,
        *,
        user: str | None = None,
        token: str | Callable[[], str] | None = None,
        api_version: str | None = None,
        timeout: float = 15.0,
        fallback: Backend | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        # The JWT of the moment, asked for at each call: a JwtFile reads a rotated file again.
        self._token = token if callable(token) or token is None else (lambda: token)
        self._user = user or "root"
        if url.startswith("unix:"):
            transport = transport or httpx.AsyncHTTPTransport(uds=url.removeprefix("unix:"))
            url = "http://slurmrestd"
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"), timeout=timeout, transport=transport
        )
        self.version = api_version
        self.fallback = fallback

    async def _api(self) -> str:
        if self.version is None:
            doc = await self._get_json("/openapi/v3", allow_error=False)
            found = sorted(
                {m.group(1) for p in doc.get("paths", {}) if (m := _VERSION.match(p))}, key=minor
            )
            if not found:
                raise Unavailable("slurmrestd offers no /slurm/v0.0.N API")
            self.version = found[-1]
        return self.version

    def own_capabilities(self) -> frozenset[Capability]:
        """What slurmrestd itself does for this backend (the API version must be known:
        after ``ping``), without the fallback."""
        caps = set(READ_CAPS)
        if self.version is not None and minor(self.version) >= 39:
            caps |= {Capability.DRAIN, Capability.RESUME}
        if self.version is not None and minor(self.version) >= 40:
            caps.add(Capability.SIGNAL)
        if self.version is not None and minor(self.version) >= REQUEUE_MINOR:
            caps |= {Capability.REQUEUE, Capability.UPDATE_JOB}
        return frozenset(caps)

    def capabilities(self) -> frozenset[Capability]:
        caps = self.own_capabilities()
        if self.fallback is not None:
            caps |= self.fallback.capabilities()
        return caps

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        if self._token is not None and (token := self._token()):
            kw["headers"] = {"X-SLURM-USER-NAME": self._user, "X-SLURM-USER-TOKEN": token}
        try:
            return await self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise Unavailable(f"slurmrestd: {type(exc).__name__}: {exc}") from exc

    async def _get_json(self, path: str, allow_error: bool = True) -> dict[str, Any]:
        resp = await self._request("GET", path)
        return _checked(resp, allow_error)

    async def ping(self) -> Ping:
        api = await self._api()
        doc = await self._get_json(f"/slurm/{api}/ping")
        pings = doc.get("pings") or []
        up = any(
            str(p.get("ping") or p.get("pinged") or "").upper() == "UP" or p.get("responding")
            for p in pings
        )
        meta = doc.get("meta") or {}
        # meta.Slurm up to 23.02 (v0.0.38: 22.05), meta.slurm since (v0.0.45: 26.05)
        release = (meta.get("Slurm") or meta.get("slurm") or {}).get("release")

        def said(p: dict[str, Any]) -> object:
            return p.get("ping") or p.get("pinged") or ("UP" if p.get("responding") else "DOWN")

        detail = f"slurmrestd {api}: " + ", ".join(f"{p.get('hostname')}={said(p)}" for p in pings)
        return Ping(up=up, detail=detail, version=release)

    async def get_node(self, node: str) -> SlurmNode:
        api = await self._api()
        doc = await self._get_json(f"/slurm/{api}/node/{node}")
        nodes = [node_from_json(n) for n in doc.get("nodes") or [] if n.get("name") == node]
        if not nodes:
            raise NotFound(f"Node {node} not found")
        return nodes[0]

    async def _jobs(self, path: str, gpus_on: str | None = None) -> list[JobState]:
        api = await self._api()
        return parse_jobs_json(await self._get_json(f"/slurm/{api}{path}"), gpus_on)

    async def jobs_on_node(self, node: str, *, gpus: bool = False) -> list[JobState]:
        """The GPUs come with the listing (gres_detail): read whether asked or not."""
        return jobs_on(await self._jobs("/jobs", gpus_on=node), node)

    async def ended_jobs_on_node(self, node: str, since: dt.datetime) -> list[JobState]:
        return ended_on(await self._jobs("/jobs"), node, since)

    async def kill_wait(self) -> float | None:
        """slurmrestd has no configuration endpoint; the CLI fallback can read it."""
        return None if self.fallback is None else await self.fallback.kill_wait()

    async def get_job(self, job_id: int) -> JobState:
        jobs = [j for j in await self._jobs(f"/job/{job_id}") if j.job_id == job_id]
        if not jobs:
            raise NotFound(f"Invalid job id specified: {job_id}")
        return jobs[0]

    async def probe_job(self, job_id: int) -> JobProbe:
        job = await self.get_job(job_id)
        return JobProbe(job.job_id, job.state, job.reason, job.nodes)

    async def _update_node(self, node: str, state: str, reason: str | None) -> None:
        api = await self._api()
        if minor(api) < 39 and self.fallback is not None:
            if state == "DRAIN":
                await self.fallback.drain(node, reason or "")
            elif state == "DOWN":
                await self.fallback.set_down(node, reason or "")
            else:
                await self.fallback.resume(node)
            return
        body = node_update_body(minor(api), state, reason)
        _checked(await self._request("POST", f"/slurm/{api}/node/{node}", json=body), True)

    async def drain(self, node: str, reason: str) -> None:
        await self._update_node(node, "DRAIN", reason)

    async def resume(self, node: str) -> None:
        await self._update_node(node, "RESUME", None)

    async def reboot(self, node: str, reason: str, *, asap: bool, resume: bool) -> None:
        why = "slurmrestd has no reboot operation; use --rest-write-fallback cli"
        await self._scontrol(why).reboot(node, reason, asap=asap, resume=resume)

    async def set_down(self, node: str, reason: str) -> None:
        await self._update_node(node, "DOWN", reason)

    async def requeue(self, job_id: int, hold: bool) -> None:
        api = await self._api()
        why = f"slurmrestd {api} has no requeue operation; use --rest-write-fallback cli"
        if (cli := await self._cli_for_jobs(why)) is not None:
            await cli.requeue(job_id, hold)
            return
        # Seen on 26.05.5: ``?Hold``, ``?Hold=true`` and ``?Hold=1`` hold the job, ``?Hold=``
        # (an empty value, what {"Hold": ""} sends) is a plain requeue.
        params = {"Hold": "true"} if hold else None
        resp = await self._request("GET", f"/slurm/{api}/job/{job_id}/requeue", params=params)
        _job_results(_checked(resp, True), "status")

    async def signal(self, job_id: int, signal: str, target: SignalTarget) -> None:
        api = await self._api()
        try:
            params = signal_params(minor(api), signal, target)
        except Unsupported:
            if self.fallback is None:
                raise
            await self.fallback.signal(job_id, signal, target)
            return
        _checked(await self._request("DELETE", f"/slurm/{api}/job/{job_id}", params=params), True)

    async def set_excluded_nodes(
        self, job_id: int, nodes: list[str], required_nodes: Nodes = None
    ) -> None:
        why = "job updates (ExcNodeList) are done with scontrol: enable fallback"
        if (cli := await self._cli_for_jobs(why)) is not None:
            await cli.set_excluded_nodes(job_id, nodes, required_nodes)
            return
        await self._update_job(job_id, job_update_body(nodes, required_nodes))

    async def start_now(
        self, job_id: int, excluded_nodes: Nodes = None, required_nodes: Nodes = None
    ) -> None:
        why = "job updates (StartTime) are done with scontrol: enable fallback"
        if (cli := await self._cli_for_jobs(why)) is not None:
            await cli.start_now(job_id, excluded_nodes, required_nodes)
            return
        body = job_update_body(excluded_nodes or None, required_nodes)
        # scontrol's StartTime=now is the client's clock too: the begin time is a timestamp.
        body["begin_time"] = {"set": True, "number": int(time.time())}
        await self._update_job(job_id, body)

    async def _cli_for_jobs(self, why: str) -> Backend | None:
        """The CLI fallback where slurmrestd predates its job requeue and update operations
        (v0.0.45; none: Unsupported, ``why``); None where slurmrestd does them itself."""
        return self._scontrol(why) if minor(await self._api()) < REQUEUE_MINOR else None

    async def _update_job(self, job_id: int, body: dict[str, Any]) -> None:
        api = await self._api()
        resp = await self._request("POST", f"/slurm/{api}/job/{job_id}", json=body)
        _job_results(_checked(resp, True), "results")

    def _scontrol(self, why: str) -> Backend:
        """The CLI fallback, for what slurmrestd cannot do; none: Unsupported (501), ``why``."""
        if self.fallback is None:
            raise Unsupported(why)
        return self.fallback

    async def aclose(self) -> None:
        await self._http.aclose()
        if self.fallback is not None:
            await self.fallback.aclose()


def _checked(resp: httpx.Response, allow_error: bool) -> dict[str, Any]:
    """JSON body, with slurmrestd's ``errors`` mapped to NotFound/Unavailable/Rejected."""
    if resp.status_code in (401, 403):
        raise Rejected(f"slurmrestd refused authentication ({resp.status_code})")
    if resp.status_code == 405:
        raise Unsupported(f"slurmrestd: {resp.request.method} {resp.request.url.path} -> 405")
    try:
        doc: dict[str, Any] = resp.json()
    except ValueError as exc:
        if resp.status_code >= 500:
            raise Unavailable(f"slurmrestd {resp.status_code}") from exc
        raise Rejected(f"slurmrestd {resp.status_code}: not JSON") from exc
    errors = [e for e in doc.get("errors") or [] if isinstance(e, dict)]
    if errors:
        text = "; ".join(str(e.get("description") or e.get("error") or e) for e in errors)
        codes = " ".join(str(e.get("error") or "") for e in errors)
        raise error_for(
            f"slurmrestd: {text}", text=f"{text} {codes}", unavailable=_DOWN, not_found=_NOT_FOUND
        )
    if resp.status_code >= 400 and not allow_error:
        raise Unavailable(f"slurmrestd {resp.status_code}")
    if resp.status_code >= 500:
        raise Unavailable(f"slurmrestd {resp.status_code}")
    return doc


def _job_results(doc: dict[str, Any], key: str) -> None:
    """A job request's per-job answer (``status`` of a requeue, ``results`` of an update):
    slurmrestd can answer 200 with a Slurm error code in it (e.g. a job pending execution)."""
    failed = [r for r in doc.get(key) or [] if isinstance(r, dict) and r.get("error_code")]
    if failed:
        text = "; ".join(str(r.get("why") or r.get("error") or r) for r in failed)
        codes = " ".join(str(r.get("error") or "") for r in failed)
        raise error_for(
            f"slurmrestd: {text}", text=f"{text} {codes}", unavailable=_DOWN, not_found=_NOT_FOUND
        )
