"""`gpuheal agent`: read the kernel log (and NVML), post what the operator consumes.

One loop: read the records available and the XID events NVML delivered, turn them into
findings and series (detect.py), and at most every `--flush-interval` seconds write what
changed: Events created or bumped, the node condition, the GPU map annotation, then the state
file. Nothing is written while nothing changes. With `--once` it reads the file from its start
to its end, writes, and exits.

XIDs are heard twice where NVML is there: the kernel log prints each, and NVML delivers it as
an `nvmlEventTypeXidCriticalError` event (what NVIDIA's device plugin listens to; it needs no
access to the kernel log). The same XID on the same GPU from both within a few seconds is one
finding, with the kernel's text where it came in time. Without access to /dev/kmsg the agent
runs on NVML alone and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from gpuheal.readiness import Readiness
from gpuheal.xid.identity import (
    GPU_MAP_ANNOTATION,
    GPU_REPORT_ANNOTATION,
    format_gpu_map,
    format_gpu_report,
    parse_gpu_map,
)
from gpuheal.xid.parse import XID_CONDITION_TYPE

from . import records as rec
from .detect import (
    COMPONENT,
    AgentState,
    Aggregator,
    Condition,
    Detector,
    Series,
    SourcePairing,
    xid_condition,
)

log = logging.getLogger("gpuheal.agent")

JSON = dict[str, Any]
Clock = Callable[[], dt.datetime]

PAIR_WINDOW = dt.timedelta(seconds=10)
"""How far apart the kernel log's record and NVML's event of one XID may be read."""
NVML_WAIT_MS = 500
KERNEL_LOG = "kernel-log"
"""The readiness problem of an agent that hears no XID: no kernel log, no NVML."""
NO_SOURCE_REASON = "KernelLogUnreadable"
"""Its Warning Event on the Node (`kubectl describe node` shows it)."""


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def rfc3339(ts: dt.datetime) -> str:
    return ts.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass
class AgentOptions:
    node: str
    kmsg: Path = Path("/dev/kmsg")
    once: bool = False
    state_file: Path | None = None
    namespace: str = "default"
    kubeconfig: str | None = None
    boot_id: str | None = None
    repeat_window: float = 600.0
    flush_interval: float = 1.0
    condition_type: str | None = XID_CONDITION_TYPE  # None: no condition
    nvml: str = "auto"  # auto | on | off
    nvml_interval: float = 60.0
    nvml_events: bool = True
    expected_gpus: int | None = None
    dry_run: bool = False
    poll_interval: float = 0.25
    ready_port: int = 0  # /readyz (0: off)
    reopen_interval: float = 10.0  # how often an unreadable kernel log is tried again


class Sink(Protocol):
    """What the agent needs of the API server (AgentKube; an in-memory fake in unit tests)."""

    async def get_node(self, name: str) -> JSON | None: ...
    async def patch_node_status(self, name: str, patch: JSON) -> JSON: ...
    async def create_event(self, namespace: str, body: JSON) -> bool: ...
    async def get_event(self, namespace: str, name: str) -> JSON | None: ...
    async def patch_event(self, namespace: str, name: str, patch: JSON) -> bool: ...


def event_body(series: Series, *, node: str, node_uid: str, namespace: str, stream: str) -> JSON:
    """The Node Event the operator consumes: the form of `gpuheal simulate xid` and of
    node-problem-detector's kernel monitor (reason, Warning, message = the driver's text)."""
    annotations = {"gpuheal.io/stream": stream, "gpuheal.io/finding": series.key}
    if series.pci:
        annotations["gpuheal.io/pci"] = series.pci
    if series.uuid:
        annotations["gpuheal.io/gpu-uuid"] = series.uuid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": series.name, "namespace": namespace, "annotations": annotations},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid},
        "reason": series.reason,
        "message": series.message,
        "type": "Warning",
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
        "firstTimestamp": rfc3339(series.first),
        "lastTimestamp": rfc3339(series.last),
        "count": series.count,
    }


def _server_count(event: Mapping[str, Any]) -> int:
    count = (event.get("series") or {}).get("count") or event.get("count") or 1
    return int(count) if isinstance(count, int) else 1


def _node_condition(node: Mapping[str, Any], type_: str) -> JSON | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


class Publisher:
    """Writes series as Events and the node's condition and GPU map, only what changed."""

    def __init__(
        self, sink: Sink, *, node: str, node_obj: Mapping[str, Any], namespace: str, clock: Clock
    ) -> None:
        self.sink = sink
        self.node = node
        self.node_uid = str((node_obj.get("metadata") or {}).get("uid") or node)
        self.namespace = namespace
        self.clock = clock
        annotations = (node_obj.get("metadata") or {}).get("annotations") or {}
        self.gpus: dict[str, str] = dict(parse_gpu_map(annotations.get(GPU_MAP_ANNOTATION)).by_pci)
        self._node_obj = node_obj
        # The GPUs last reported as seen (gpuheal.io/gpus-seen); None: none yet since start
        self.reported: dict[str, str] | None = None
        self.condition: JSON | None = None
        self.posts = 0  # API writes, for logs and tests

    def current_condition(self, type_: str) -> JSON | None:
        if self.condition is None or self.condition.get("type") != type_:
            self.condition = _node_condition(self._node_obj, type_)
        return self.condition

    async def publish(self, series: Series, stream: str) -> None:
        body = event_body(
            series, node=self.node, node_uid=self.node_uid, namespace=self.namespace, stream=stream
        )
        if series.posted == 0:
            self.posts += 1
            if await self.sink.create_event(self.namespace, body):
                series.posted = series.count
                return
            # Posted before (a restart that lost its state): take the larger count.
            existing = await self.sink.get_event(self.namespace, series.name)
            if existing is not None:
                server = _server_count(existing)
                if server >= series.count:
                    series.count = series.posted = server
                    return
        patch = {"count": series.count, "lastTimestamp": rfc3339(series.last)}
        self.posts += 1
        if not await self.sink.patch_event(self.namespace, series.name, patch):
            # Expired (the API server's event TTL) while the fault went on: post it again.
            await self.sink.create_event(self.namespace, body)
        series.posted = series.count

    async def sync_node(
        self,
        condition: Condition | None,
        gpus: Mapping[str, str],
        seen: Mapping[str, str] | None = None,
    ) -> bool:
        """One status PATCH when the condition or the GPU map differs from the node's, or
        the GPUs NVML sees now (``seen``) were not reported since the start as they are: the
        report, dated, is how gpuheal knows the GPUs answered after a reset."""
        patch: JSON = {}
        if condition is not None:
            old = self.current_condition(condition.type)
            wanted = (condition.status, condition.reason, condition.message)
            same = (
                old is not None
                and (
                    old.get("status"),
                    old.get("reason"),
                    old.get("message"),
                )
                == wanted
            )
            if not same:
                now = rfc3339(self.clock())
                since = (
                    old.get("lastTransitionTime")
                    if old is not None and old.get("status") == condition.status
                    else now
                )
                new = {
                    "type": condition.type,
                    "status": condition.status,
                    "reason": condition.reason,
                    "message": condition.message[:1024],
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": since or now,
                }
                patch["status"] = {"conditions": [new]}
        merged = {**self.gpus, **gpus}
        annotations: JSON = {}
        if gpus and merged != self.gpus:
            annotations[GPU_MAP_ANNOTATION] = format_gpu_map(merged)
        if seen is not None and dict(seen) != self.reported:
            annotations[GPU_REPORT_ANNOTATION] = format_gpu_report(self.clock(), seen)
        if annotations:
            patch["metadata"] = {"annotations": annotations}
        if not patch:
            return False
        self.posts += 1
        await self.sink.patch_node_status(self.node, patch)
        if "status" in patch:
            self.condition = patch["status"]["conditions"][0]
        if GPU_MAP_ANNOTATION in annotations:
            self.gpus = merged
        if GPU_REPORT_ANNOTATION in annotations and seen is not None:
            self.reported = dict(seen)
        return True


class DryRunSink:
    """`--dry-run`: print what would be written (one JSON object per line), talk to nobody."""

    def __init__(self, out: Any = None) -> None:
        self.out = out or sys.stdout

    def _print(self, what: str, body: Mapping[str, Any]) -> None:
        self.out.write(json.dumps({"write": what, **body}, sort_keys=True) + "\n")

    async def get_node(self, name: str) -> JSON | None:
        return {"metadata": {"name": name, "uid": name}}

    async def patch_node_status(self, name: str, patch: JSON) -> JSON:
        self._print("nodeStatus", {"node": name, "patch": patch})
        return {}

    async def create_event(self, namespace: str, body: JSON) -> bool:
        self._print("event", body)
        return True

    async def get_event(self, namespace: str, name: str) -> JSON | None:
        return None

    async def patch_event(self, namespace: str, name: str, patch: JSON) -> bool:
        self._print("eventPatch", {"name": name, "patch": patch})
        return True


def load_state(path: Path | None) -> AgentState | None:
    if path is None:
        return None
    try:
        return AgentState.loads(path.read_text())
    except OSError:
        return None


def save_state(path: Path | None, state: AgentState, previous: str | None = None) -> str | None:
    """Write the state file (atomically) unless it would not change; return what is on disk."""
    if path is None:
        return None
    text = state.dumps()
    if text == previous:
        return previous
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only or full disk must not stop detection
        log.warning("cannot write state file %s: %s", path, exc)
        return previous
    return text


class Agent:
    """The loop, with its parts exposed for tests (`step`, `flush`)."""

    def __init__(self, opts: AgentOptions, sink: Sink, *, clock: Clock = utcnow) -> None:
        self.opts = opts
        self.sink = sink
        self.clock = clock
        self.detector = Detector()
        self.agg: Aggregator | None = None
        self.publisher: Publisher | None = None
        self.cursor = 0
        self.stream: str | None = None
        self.nvml: Any = None
        self.inventory: Any = None
        self._next_probe = 0.0
        self._kmsg: rec.KmsgDevice | None = None
        self._text: rec.TextLog | None = None
        self._saved: str | None = None
        self.pairing = SourcePairing(PAIR_WINDOW)
        self.nvml_xids: collections.deque[Any] = collections.deque(maxlen=10_000)
        self.listener: Any = None
        self.readiness = Readiness(log)
        self._next_open = 0.0

    # ---- set-up ---------------------------------------------------------------------------
    async def start(self) -> None:
        if self.opts.nvml != "off":
            from .nvml import load_nvml

            self.nvml = load_nvml()
            if self.nvml is None and self.opts.nvml == "on":
                raise SystemExit("gpuheal agent: --nvml on, but NVML is not available here")
        failed = self.open_kernel_log()
        nvml_only = failed is not None and self.nvml is not None and self.opts.nvml_events
        if nvml_only:
            log.warning("%s: XIDs from NVML events only", failed)
            if self.stream is None:  # where NVML's findings go
                self._set_stream(rec.boot_stream_id(self._boot_id()))
        elif failed is not None and self.opts.once:
            raise SystemExit(f"gpuheal agent: {failed}")
        node_obj = await self.sink.get_node(self.opts.node)
        if node_obj is None:
            raise SystemExit(f"gpuheal agent: node {self.opts.node!r} not found")
        self.publisher = Publisher(
            self.sink,
            node=self.opts.node,
            node_obj=node_obj,
            namespace=self.opts.namespace,
            clock=self.clock,
        )
        self.detector.learn(self.publisher.gpus)
        if failed is not None and not nvml_only:
            await self._no_source(failed)

    def _boot_id(self) -> str:
        return self.opts.boot_id or rec.read_boot_id() or "unknown"

    def open_kernel_log(self) -> str | None:
        """Open the kernel log (a /dev/kmsg device, else a text file); None when it opened,
        else why it cannot be read."""
        path = self.opts.kmsg
        try:
            if rec.is_char_device(path):
                self._kmsg = rec.KmsgDevice(path, rec.boot_time(self.clock()))
                if self.stream is None:
                    self._set_stream(rec.boot_stream_id(self._boot_id()))
            else:
                self._text = rec.TextLog(path)
        except OSError as exc:
            return (
                f"cannot read the kernel log {path} ({exc.strerror}): it must be mounted and "
                "readable (/dev/kmsg needs CAP_SYSLOG, as the chart's DaemonSet runs it), or "
                "NVML must be there to hear XIDs from"
            )
        return None

    async def _no_source(self, why: str) -> None:
        """Neither the kernel log nor NVML: no XID can be heard. Not a reason to exit (a
        DaemonSet would restart it into the same wall, a crash loop that hides why): the
        agent stays up, not ready with the reason, says it once in its log and once as a
        Warning Event on its Node, and tries the log again every `reopen_interval`."""
        self.readiness.problem(KERNEL_LOG, why)
        assert self.publisher is not None
        now = self.clock()
        name = f"{self.opts.node}.{NO_SOURCE_REASON.lower()}.{int(now.timestamp()):x}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": self.opts.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.opts.node,
                "uid": self.publisher.node_uid,
            },
            "reason": NO_SOURCE_REASON,
            "message": f"gpuheal agent hears no XID on this node: {why}"[:1024],
            "type": "Warning",
            "source": {"component": COMPONENT, "host": self.opts.node},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.opts.node,
            "firstTimestamp": rfc3339(now),
            "lastTimestamp": rfc3339(now),
            "count": 1,
        }
        try:
            await self.sink.create_event(self.opts.namespace, body)
        except Exception as exc:  # the log line and /readyz still say it
            log.warning("could not post the %s Event: %s", NO_SOURCE_REASON, exc)

    def reopen(self) -> bool:
        """With no source, try the kernel log again (quietly); True when it opened now."""
        if self._kmsg is not None or self._text is not None:
            return False
        if self.open_kernel_log() is not None:
            return False
        self.readiness.resolved(KERNEL_LOG)
        return True

    def _set_stream(self, stream: str) -> None:
        """A new stream (boot, or text file): restore the state saved for it, if any."""
        self.stream = stream
        self.agg = Aggregator(self.opts.node, stream, dt.timedelta(seconds=self.opts.repeat_window))
        self.cursor = 0
        state = load_state(self.opts.state_file)
        if state is not None and state.node == self.opts.node and state.stream == stream:
            self.cursor = state.cursor
            self.agg.restore(state.series)
            self.detector.learn(state.gpus)
            log.info("resuming %s after position %d (state file)", stream, self.cursor)

    # ---- one round ------------------------------------------------------------------------
    def read(self, *, final: bool = False) -> int:
        """Read what is available; return how many records were new."""
        now = self.clock()
        records: list[rec.Record] = []
        if self._kmsg is not None:
            records = self._kmsg.read_available()
        elif self._text is not None:
            lines = self._text.read_available(final=final)
            if self._text.rotated:
                self._text.rotated = False
                self.stream = None
            if self.stream is None and self._text.first_line is not None:
                self._set_stream(rec.text_stream_id(self._text.first_line))
            for lineno, line in lines:
                r = rec.text_record(lineno, line)
                if r is not None:
                    records.append(r)
        new = 0
        for r in records:
            findings = self.detector.feed(r)  # earlier records too: identity and context
            if r.position <= self.cursor:
                continue
            new += 1
            self.cursor = r.position
            assert self.agg is not None
            for f in findings:
                if self.pairing.admit("kmsg", f, now):
                    self.agg.add(f, now)
                else:  # NVML told it first: its Event carries the driver's text if not out yet
                    self.agg.refine(f)
        return new

    def take_nvml_xids(self) -> int:
        """Turn the XID events the listener thread queued into findings; return how many."""
        from .nvml import xid_finding

        taken = 0
        while self.nvml_xids and self.agg is not None:  # kept until a stream is known
            event = self.nvml_xids.popleft()
            taken += 1
            now = self.clock()
            finding = xid_finding(event, now)
            if self.pairing.admit("nvml", finding, now):
                self.agg.add(finding, now)
        return taken

    def _start_listener(
        self, wake: Callable[[], object], stop: threading.Event
    ) -> threading.Thread | None:
        if self.nvml is None or not self.opts.nvml_events or self.opts.once:
            return None
        from .nvml import XidListener

        self.listener = XidListener.register(self.nvml)
        if self.listener is None:
            return None
        thread = threading.Thread(
            target=self._listen, args=(wake, stop), name="nvml-xid-events", daemon=True
        )
        thread.start()
        return thread

    def _listen(self, wake: Callable[[], object], stop: threading.Event) -> None:
        """The listener thread: NVML's wait blocks, so it runs here and hands events over."""
        failures = 0
        while not stop.is_set():
            try:
                event = self.listener.wait(NVML_WAIT_MS)
            except Exception as exc:  # e.g. GPU_IS_LOST after an XID 79: keep listening
                failures += 1
                if failures in (1, 10) or failures % 600 == 0:
                    log.warning("NVML event wait failed (%s); %d failure(s)", exc, failures)
                stop.wait(min(5.0, 0.5 * failures))
                continue
            failures = 0
            if event is not None:
                log.info("NVML: Xid %d on %s", event.xid, event.pci or "an unknown GPU")
                self.nvml_xids.append(event)
                wake()

    def probe_nvml(self) -> None:
        if self.nvml is None:
            return
        from .nvml import health_findings, read_inventory

        now = self.clock()
        try:
            current = read_inventory(self.nvml)
        except Exception as exc:
            log.warning("NVML probe failed: %s", exc)
            return
        self.detector.learn(current.uuids)
        if self.agg is not None:
            for f in health_findings(
                self.inventory, current, now, expected_gpus=self.opts.expected_gpus
            ):
                self.agg.add(f, now)
        self.inventory = current

    async def flush(self) -> None:
        """Write what changed; keep the state file in step with what the API server has."""
        if self.agg is None or self.publisher is None or self.stream is None:
            return
        for series in self.agg.dirty():
            await self.publisher.publish(series, self.stream)
        condition = None
        if self.opts.condition_type:
            condition = xid_condition(self.agg.series.values(), self.opts.condition_type)
        gpus = self.detector.gpu_map.by_pci
        # What NVML sees now (its last probe), reported when it changes and once per start.
        seen = self.inventory.uuids if self.inventory is not None else None
        await self.publisher.sync_node(condition, gpus, seen)
        self._saved = save_state(
            self.opts.state_file,
            AgentState(
                node=self.opts.node,
                stream=self.stream,
                cursor=self.cursor,
                series=list(self.agg.series.values()),
                condition=condition,
                gpus=dict(gpus),
            ),
            self._saved,
        )

    # ---- the loop -------------------------------------------------------------------------
    def _try_log_again(self, loop: asyncio.AbstractEventLoop, wake: asyncio.Event) -> None:
        """While the agent hears nothing, the kernel log again every `reopen_interval`."""
        if not self.readiness.problems() or loop.time() < self._next_open:
            return
        self._next_open = loop.time() + self.opts.reopen_interval
        if self.reopen() and self._kmsg is not None:
            loop.add_reader(self._kmsg.fd, wake.set)

    async def run(self, stop: asyncio.Event | None = None) -> int:
        await self.start()
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        if self._kmsg is not None and not self.opts.once:
            loop.add_reader(self._kmsg.fd, wake.set)
        listening = threading.Event()
        thread = self._start_listener(lambda: loop.call_soon_threadsafe(wake.set), listening)
        failures = 0
        self._next_open = loop.time() + self.opts.reopen_interval
        try:
            while True:
                self._try_log_again(loop, wake)
                self.read(final=self.opts.once)
                self.take_nvml_xids()
                if loop.time() >= self._next_probe:
                    self.probe_nvml()
                    self._next_probe = loop.time() + self.opts.nvml_interval
                try:
                    await self.flush()
                    failures = 0
                except Exception as exc:  # the API server away: keep reading, retry later
                    failures += 1
                    log.warning("writing to the API server failed (%s); will retry", exc)
                    if self.opts.once and failures >= 5:
                        return 1
                    await asyncio.sleep(min(30.0, 0.5 * 2**failures))
                    continue
                if self.opts.once or stop.is_set():
                    return 0
                wake.clear()
                timeout = self.opts.flush_interval if self._kmsg else self.opts.poll_interval
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_first(wake, stop), timeout=max(timeout, 0.05))
                if self._kmsg is not None:
                    await asyncio.sleep(0)  # records of one burst arrive together
        finally:
            listening.set()
            if thread is not None:  # its wait returns within NVML_WAIT_MS
                await asyncio.to_thread(thread.join, 2 * NVML_WAIT_MS / 1000)
                self.listener.close()
            if self._kmsg is not None:
                with contextlib.suppress(Exception):
                    loop.remove_reader(self._kmsg.fd)
                self._kmsg.close()
            if self._text is not None:
                self._text.close()
            if self.nvml is not None:
                with contextlib.suppress(Exception):
                    self.nvml.nvmlShutdown()


async def _first(*events: asyncio.Event) -> None:
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


async def _main(opts: AgentOptions) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # a clean stop: last flush, state saved
        loop.add_signal_handler(sig, stop.set)
    if opts.dry_run:
        return await Agent(opts, DryRunSink()).run(stop)
    from .kube import AgentKube

    kube = await AgentKube.connect(opts.kubeconfig)
    try:
        agent = Agent(opts, kube)
        if opts.ready_port:
            agent.readiness.serve(opts.ready_port)
        return await agent.run(stop)
    finally:
        await kube.close()


def _options(args: argparse.Namespace) -> AgentOptions:
    if not args.node and not args.dry_run:
        raise SystemExit("gpuheal agent: --node (or $NODE_NAME) is required")
    return AgentOptions(
        node=args.node or "local",
        kmsg=Path(args.kmsg),
        once=args.once,
        state_file=Path(args.state_file) if args.state_file else None,
        namespace=args.event_namespace,
        kubeconfig=args.kubeconfig,
        boot_id=args.boot_id,
        repeat_window=args.repeat_window,
        flush_interval=args.flush_interval,
        condition_type=None if args.no_condition else args.condition_type,
        nvml=args.nvml,
        nvml_interval=args.nvml_interval,
        nvml_events=args.nvml_events == "on",
        expected_gpus=args.expected_gpus,
        dry_run=args.dry_run,
        ready_port=args.ready_port,
        reopen_interval=args.reopen_interval,
    )


def _run(args: argparse.Namespace) -> int:
    return asyncio.run(_main(_options(args)))


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    """`gpuheal agent ...` (every flag also from its environment variable where noted)."""
    env = os.environ.get
    p.formatter_class = argparse.RawDescriptionHelpFormatter  # the module docstring's lists
    p.add_argument(
        "--node",
        default=env("NODE_NAME"),
        help="this node's name (default: $NODE_NAME, set from the downward API)",
    )
    p.add_argument(
        "--kmsg",
        default="/dev/kmsg",
        help="kernel log: /dev/kmsg (records), or a text file of dmesg, `dmesg -T`, "
        "`journalctl -k` or syslog lines (default: %(default)s)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="read the log from its start to its end, write, exit (replay an old log)",
    )
    p.add_argument(
        "--state-file",
        default=env("GPUHEAL_AGENT_STATE_FILE"),
        help="where to keep the read position and the Events' counts across restarts "
        "(default: none; without it a restart reconciles with the Events already posted)",
    )
    p.add_argument(
        "--event-namespace",
        default="default",
        help="namespace of the Events (default: %(default)s, the only one the API server "
        "accepts for Events about a Node)",
    )
    p.add_argument("--kubeconfig", default=env("KUBECONFIG"), help="default: in-cluster")
    p.add_argument(
        "--boot-id", help="boot id of the /dev/kmsg stream (default: from /proc; for tests)"
    )
    p.add_argument(
        "--repeat-window",
        type=float,
        default=600.0,
        help="seconds within which identical records bump one Event's count (default: 600)",
    )
    p.add_argument(
        "--flush-interval",
        type=float,
        default=1.0,
        help="at most one round of API writes per this many seconds (default: 1)",
    )
    p.add_argument(
        "--condition-type",
        default=XID_CONDITION_TYPE,
        help="node condition kept current (default: %(default)s)",
    )
    p.add_argument("--no-condition", action="store_true", help="post Events only")
    p.add_argument(
        "--nvml",
        choices=["auto", "on", "off"],
        default=env("GPUHEAL_AGENT_NVML", "auto"),
        help="NVML probe: auto = when the driver library is there (default: %(default)s)",
    )
    p.add_argument("--nvml-interval", type=float, default=60.0, help="seconds between probes")
    p.add_argument(
        "--nvml-events",
        choices=["on", "off"],
        default=env("GPUHEAL_AGENT_NVML_EVENTS", "on"),
        help="with NVML, also listen for its XID events (nvmlEventTypeXidCriticalError); "
        "the same XID from the kernel log and NVML is posted once (default: %(default)s)",
    )
    p.add_argument(
        "--expected-gpus",
        type=int,
        help="GPU count below which a GpuCountDropped Event is posted (default: the count "
        "NVML saw first)",
    )
    p.add_argument(
        "--ready-port",
        type=int,
        default=int(env("GPUHEAL_AGENT_READY_PORT") or 0),
        help="serve GET /readyz here: 503 with the reason while no XID can be heard (the "
        "kernel log unreadable and no NVML) (default: 0, off)",
    )
    p.add_argument(
        "--reopen-interval",
        type=float,
        default=10.0,
        help="seconds between tries of a kernel log that could not be read (default: 10)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the writes as JSON lines instead of talking to a cluster",
    )
    p.set_defaults(func=_run)
