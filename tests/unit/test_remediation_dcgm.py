"""dcgm-exporter scraping against a real local HTTP server serving exporter text."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest
from prometheus_client import CollectorRegistry

from gpuheal.adapters.dcgm import DcgmScraper
from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.policy.reading import engine_view
from gpuheal.policy.types import ALWAYS, NodeView
from gpuheal.remediation.sources import scrape_once
from gpuheal.remediation.state import Runtime

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


def pod(node: str, ip: str = "127.0.0.1") -> dict[str, Any]:
    return {"spec": {"nodeName": node}, "status": {"podIP": ip, "phase": "Running"}}


async def test_counter_rise_becomes_an_xid_signal_and_the_first_scrape_is_a_baseline(
    exporter: int,
) -> None:
    rt = Runtime(OperatorConfig(dcgm_port=exporter), Metrics(CollectorRegistry()))
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
    rt = Runtime(OperatorConfig(dcgm_port=exporter), Metrics(CollectorRegistry()))
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
    rt = Runtime(OperatorConfig(), Metrics(CollectorRegistry()))
    rt.view.dcgm_nodes = {"n1"}
    for node in rt.view.dcgm_nodes:
        rt.view.set_blind("dcgm", node)
    assert readable_since(rt, "n1") is None
    assert readable_since(rt, "n9") == ALWAYS
    rt.view.set_blind("events")  # a global source: every node
    assert readable_since(rt, "n9") is None
