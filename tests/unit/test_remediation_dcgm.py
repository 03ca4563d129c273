"""dcgm-exporter scraping against a real local HTTP server serving exporter text."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from gpuheal.adapters.dcgm import DcgmScraper, ScrapeFailed, read_capped
from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.policy.reading import engine_view
from gpuheal.policy.trust import exporter_pod_refusal, samples_of_node
from gpuheal.policy.types import ALWAYS, NodeView
from gpuheal.remediation.sources import scrape_once
from gpuheal.remediation.state import Runtime
from gpuheal.xid.parse import parse_dcgm_metrics

UUID = "GPU-12345678-1234-1234-1234-123456789abc"


def exporter_text(count: int, gauge: int) -> str:
    labels = f'gpu="0",UUID="{UUID}",pci_bus_id="00000000:3B:00.0",Hostname="n1"'
    return (
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n"
        "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"
        f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {gauge}\n"
        f'DCGM_EXP_XID_ERRORS_COUNT{{{labels},xid="79"}} {count}\n'
        f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 41\n"
    )


class _Exporter(BaseHTTPRequestHandler):
    text: ClassVar[str] = exporter_text(0, 0)

    def do_GET(self) -> None:
        body = type(self).text.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[int]:
    _Exporter.text = exporter_text(0, 0)
    server = HTTPServer(("127.0.0.1", 0), _Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()


NAMESPACE, DAEMONSET = "gpu-operator", "nvidia-dcgm-exporter"


def pod(
    node: str, ip: str = "127.0.0.1", *, owner: str = DAEMONSET, namespace: str = NAMESPACE
) -> dict[str, Any]:
    """An exporter pod as the DaemonSet ``owner``'s controller makes it."""
    ref = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": owner, "uid": "ds-uid",
           "controller": True}  # fmt: skip
    meta = {"name": f"{owner}-{node}", "namespace": namespace, "uid": f"{owner}-{node}-{ip}",
            "ownerReferences": [ref]}  # fmt: skip
    return {
        "metadata": meta,
        "spec": {"nodeName": node},
        "status": {"podIP": ip, "phase": "Running"},
    }


def config(**over: Any) -> OperatorConfig:
    return OperatorConfig(dcgm_namespace=NAMESPACE, **over)


async def test_counter_rise_becomes_an_xid_signal_and_the_first_scrape_is_a_baseline(
    exporter: int,
) -> None:
    rt = Runtime(config(dcgm_port=exporter), Metrics(CollectorRegistry()))
    previous: dict[str, dict[Any, float]] = {}
    http = DcgmScraper(port=exporter, timeout=2)
    _Exporter.text = exporter_text(2, 79)  # XIDs from before we started
    assert await scrape_once(rt.ports, rt.view, http, [pod("n1")], previous) == []
    assert await scrape_once(rt.ports, rt.view, http, [pod("n1")], previous) == []  # nothing new
    _Exporter.text = exporter_text(3, 79)  # the counter rose; the gauge cannot show it
    ((node, signal),) = await scrape_once(rt.ports, rt.view, http, [pod("n1")], previous)
    await http.close()
    assert node == "n1"
    # one key per GPU whatever the source: the PCI address (dcgm names both)
    assert (signal.source, signal.xid, signal.gpu) == ("dcgm", 79, "0000:3b:00")
    assert rt.ports.metrics.source_up.labels("dcgm")._value.get() == 1


def readable_since(rt: Runtime, node: str) -> dt.datetime | None:
    """Since when the engine sees the node's sources readable (None: blind)."""
    if node not in rt.view.nodes:
        rt.view.set_node(NodeView(name=node))
    return engine_view(rt.view.reading(), node).sources_readable_since


async def test_unreadable_exporter_is_blind_not_healthy(exporter: int) -> None:
    rt = Runtime(config(dcgm_port=exporter), Metrics(CollectorRegistry()))
    http = DcgmScraper(port=exporter, timeout=1)
    out = await scrape_once(rt.ports, rt.view, http, [pod("n1"), pod("n2", ip="127.0.0.2")], {})
    await http.close()
    assert out == []
    assert rt.ports.metrics.source_up.labels("dcgm")._value.get() == 0
    # Blind for the node whose exporter cannot be read, and only for it (issue 12: a blind
    # source holds back only the nodes it covers; this used to make every node blind).
    assert rt.view.blind_nodes["dcgm"] == {"n2"}
    assert readable_since(rt, "n2") is None
    assert readable_since(rt, "n1") is not None
    assert rt.ports.metrics.source_errors.labels("dcgm")._value.get() == 1
    # Read again: readable from now on (blind time is not healthy time).
    http = DcgmScraper(port=exporter, timeout=1)
    await scrape_once(rt.ports, rt.view, http, [pod("n1"), pod("n2")], {})
    await http.close()
    back = readable_since(rt, "n2")
    assert back is not None
    assert back > dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    assert readable_since(rt, "n1") == ALWAYS


async def test_listing_the_exporters_failing_blinds_the_nodes_they_covered() -> None:
    rt = Runtime(config(), Metrics(CollectorRegistry()))
    rt.view.dcgm_nodes = {"n1"}
    for node in rt.view.dcgm_nodes:
        rt.view.set_blind("dcgm", node)
    assert readable_since(rt, "n1") is None
    assert readable_since(rt, "n9") == ALWAYS
    rt.view.set_blind("events")  # a global source: every node
    assert readable_since(rt, "n9") is None


def signals(rt: Runtime, result: str) -> float:
    return float(rt.ports.metrics.signals.labels("dcgm", result)._value.get())


async def test_a_labelled_pod_not_of_the_daemonset_is_never_scraped(exporter: int) -> None:
    """Anyone who may create a pod with the exporter's label (in its namespace or another)
    must not speak for a node: only the configured DaemonSet's pods are scraped."""
    rt = Runtime(config(dcgm_port=exporter), Metrics(CollectorRegistry()))
    http = DcgmScraper(port=exporter, timeout=2)
    previous: dict[str, dict[Any, float]] = {}
    told: set[str] = set()
    strangers = [
        pod("n1", owner="impostor"),
        pod("n1", namespace="ci"),
        {**pod("n1"), "metadata": {"name": "bare", "namespace": NAMESPACE, "uid": "bare"}},
    ]
    for count in (0, 1, 2):
        _Exporter.text = exporter_text(count, 79 if count else 0)
        assert await scrape_once(rt.ports, rt.view, http, strangers, previous, told) == []
    await http.close()
    assert previous == {}  # never read
    assert rt.view.dcgm_nodes == set()
    assert signals(rt, "untrusted") == 9  # three pods, three rounds
    assert len(told) == 3  # each named once


async def test_series_naming_another_hostname_are_ignored_and_counted(exporter: int) -> None:
    """The exporter on n2 (or an address reused by another pod) serving n1's series: they
    say nothing about n2."""
    rt = Runtime(config(dcgm_port=exporter), Metrics(CollectorRegistry()))
    http = DcgmScraper(port=exporter, timeout=2)
    previous: dict[str, dict[Any, float]] = {}
    for count in (0, 1, 2):
        _Exporter.text = exporter_text(count, 79 if count else 0)  # Hostname="n1"
        assert await scrape_once(rt.ports, rt.view, http, [pod("n2")], previous) == []
    assert signals(rt, "wrong_node") == 6  # two series, three rounds
    assert rt.ports.metrics.source_up.labels("dcgm")._value.get() == 1  # read, though
    _Exporter.text = exporter_text(3, 79)
    assert await scrape_once(rt.ports, rt.view, http, [pod("n1")], previous) == []  # baseline
    _Exporter.text = exporter_text(4, 79)
    ((node, _),) = await scrape_once(rt.ports, rt.view, http, [pod("n1")], previous)
    await http.close()
    assert node == "n1"


def test_exporter_pod_refusal_says_why() -> None:
    assert exporter_pod_refusal(pod("n1"), namespace=NAMESPACE, daemonset=DAEMONSET) is None
    elsewhere = exporter_pod_refusal(pod("n1", namespace="ci"), namespace=NAMESPACE,
                                     daemonset=DAEMONSET)  # fmt: skip
    assert elsewhere == f"pod ci/{DAEMONSET}-n1 is not in the namespace {NAMESPACE}"
    impostor = exporter_pod_refusal(pod("n1", owner="x"), namespace=NAMESPACE, daemonset=DAEMONSET)
    assert impostor == (
        f"pod {NAMESPACE}/x-n1 is not a pod of the DaemonSet {NAMESPACE}/{DAEMONSET} "
        "(its controller: 'DaemonSet x')"
    )
    not_controller = pod("n1")
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    refusal = exporter_pod_refusal(not_controller, namespace=NAMESPACE, daemonset=DAEMONSET)
    assert refusal is not None
    assert refusal.endswith("(its controller: 'nothing')")
    other_group = pod("n1")
    other_group["metadata"]["ownerReferences"][0]["apiVersion"] = "example.com/v1"
    assert exporter_pod_refusal(other_group, namespace=NAMESPACE, daemonset=DAEMONSET)


def test_samples_of_node_keep_only_that_hostname() -> None:
    text = exporter_text(1, 79) + exporter_text(1, 79).replace('Hostname="n1"', 'Hostname="n2"')
    text += 'DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-x"} 79\n'  # no Hostname
    kept, others = samples_of_node(parse_dcgm_metrics(text), "n1")
    assert [s.hostname for s in kept] == ["n1", "n1"]
    assert others == 3


class _Big(BaseHTTPRequestHandler):
    size: ClassVar[int] = 0
    announce: ClassVar[bool] = True
    delay: ClassVar[float] = 0.0

    def do_GET(self) -> None:
        time.sleep(type(self).delay)
        self.send_response(200)
        if type(self).announce:
            self.send_header("Content-Length", str(type(self).size))
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        with contextlib.suppress(OSError):  # the scraper hangs up past its cap
            for _ in range(type(self).size // 65536):
                self.wfile.write(b"#" * 65536)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def big() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Big)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "streamed"])
async def test_a_body_over_the_cap_is_a_failed_scrape(big: int, announce: bool) -> None:
    _Big.size, _Big.announce, _Big.delay = 4 * 1024 * 1024, announce, 0.0
    http = DcgmScraper(port=big, timeout=5, max_bytes=1024 * 1024)
    try:
        with pytest.raises(ScrapeFailed, match=r"over 1048576"):
            await http.scrape("127.0.0.1")
        assert len(await DcgmScraper(port=big, max_bytes=8 << 20).scrape("127.0.0.1")) == 4 << 20
    finally:
        await http.close()


async def test_a_slow_exporter_is_a_failed_scrape_within_the_timeout(big: int) -> None:
    _Big.size, _Big.announce, _Big.delay = 10, True, 3.0
    http = DcgmScraper(port=big, timeout=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(ScrapeFailed, match="Timeout"):
            await http.scrape("127.0.0.1")
    finally:
        await http.close()
    assert time.monotonic() - started < 2.5


async def test_read_capped_stops_at_the_cap() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 100

    assert len(await read_capped(chunks(), 1000)) == 1000
    with pytest.raises(ScrapeFailed, match="over 999 bytes"):
        await read_capped(chunks(), 999)


async def test_https_and_a_bearer_token_read_from_its_file(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text="")

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    http = DcgmScraper(port=9400, scheme="https", token_file=str(token), server_name="exporter",
                       transport=httpx.MockTransport(answer))  # fmt: skip
    await http.scrape("10.0.0.7")
    token.write_text("rotated\n")
    os.utime(token, ns=(1, 1))  # a Secret volume swaps the file: a new stamp
    await http.scrape("fd00::7")
    await http.close()
    assert [str(r.url) for r in seen] == [
        "https://10.0.0.7:9400/metrics", "https://[fd00::7]:9400/metrics"]  # fmt: skip
    assert [r.headers["Authorization"] for r in seen] == ["Bearer s3cret", "Bearer rotated"]
    assert seen[0].extensions["sni_hostname"] == "exporter"


def test_dcgm_needs_its_namespace_and_a_token_needs_https() -> None:
    assert "dcgm" not in OperatorConfig().sources  # off unless asked: it needs a namespace
    with pytest.raises(ValidationError, match="--dcgm-namespace: required with the dcgm"):
        OperatorConfig(sources="conditions,dcgm")  # type: ignore[arg-type]
    assert OperatorConfig(sources="dcgm", dcgm_namespace="gpu-operator")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="--dcgm-token-file: only with --dcgm-scheme https"):
        config(dcgm_token_file="/t")
    assert config(dcgm_token_file="/t", dcgm_scheme="https").dcgm_max_bytes == 8 * 1024 * 1024
