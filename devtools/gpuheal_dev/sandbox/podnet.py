"""Services and cluster DNS for the real node's pods: what kube-proxy and CoreDNS give a cluster.

Without them a pod cannot reach the API server (``KUBERNETES_SERVICE_HOST`` is the
``kubernetes`` Service's ClusterIP), a Service by its name, or the host's daemons (the API
server and slurmrestd listen on 127.0.0.1 only). kube-proxy itself would write host-wide
``KUBE-*`` chains that sandboxes side by side would fight over and that outlive a sandbox; this
is the least of it, per sandbox, on the real node's own bridge only:

- NAT chains named by the node's key, jumped to only for packets entering from (PREROUTING
  ``-i``) or leaving by (POSTROUTING ``-o``) its bridge: each Service's ClusterIP:port to its
  first ready endpoint (a single backend is all the sandbox runs); the ``kubernetes`` Service's
  backend is the API server on 127.0.0.1 (it writes no endpoints for a loopback address),
  reachable because the bridge has ``route_localnet``;
  a flow sent back into the bridge (pod -> Service -> pod) is masqueraded so its reply returns
  through the host's conntrack.
- ``gateway:<port>`` -> ``127.0.0.1:<port>`` for the ports listed in ``host_ports_file`` (one a
  line, read each second: ``RealNode.expose_host_port``, e.g. slurmrestd's), so a pod reaches
  that host daemon at the bridge's gateway address, as on a real node it would reach a host.
- a DNS server on the gateway address (the kubelet's ``clusterDNS``) answering
  ``<service>.<namespace>.svc.cluster.local`` A queries; every other name is NXDOMAIN (the
  sandbox's pods need no other).

Run by ``RealNode.start`` as ``python -m gpuheal_dev.sandbox.podnet``; it polls the Services and
EndpointSlices every second and rewrites its chains when they change. ``cleanup`` removes the
jumps and chains (on SIGTERM, and again from ``RealNode.stop``).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("gpuheal_dev.sandbox.podnet")

CLUSTER_DOMAIN = "cluster.local"
_TTL = 5


def chains(key: str) -> tuple[str, str]:
    """(the DNAT chain, the masquerade chain) of the real node ``key``."""
    return f"GPUHEAL-SVC-{key}", f"GPUHEAL-MASQ-{key}"


def _jumps(key: str, bridge: str) -> list[list[str]]:
    svc, masq = chains(key)
    return [
        ["PREROUTING", "-i", bridge, "-j", svc],
        ["POSTROUTING", "-o", bridge, "-j", masq],
    ]


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        ["iptables", "-w", "5", "-t", "nat", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if check and out.returncode != 0:
        raise RuntimeError(f"iptables {' '.join(args)}: {out.stderr.strip()}")
    return out


def setup(key: str, bridge: str) -> None:
    for chain in chains(key):
        _iptables("-N", chain, check=False)  # exists already: fine
    for jump in _jumps(key, bridge):
        if _iptables("-C", *jump, check=False).returncode != 0:
            _iptables("-I", *jump)


def cleanup(key: str, bridge: str) -> None:
    """Remove the jumps and chains of real node ``key``; safe to call again."""
    for jump in _jumps(key, bridge):
        while _iptables("-D", *jump, check=False).returncode == 0:
            pass
    for chain in chains(key):
        _iptables("-F", chain, check=False)
        _iptables("-X", chain, check=False)


def render_rules(
    key: str,
    subnet: str,
    gateway: str,
    services: Sequence[tuple[str, int, str, int]],
    host_ports: Sequence[int],
) -> str:
    """``iptables-restore --noflush`` input: ``services`` are (cluster IP, port, endpoint IP,
    endpoint port), TCP."""
    svc, masq = chains(key)
    lines = ["*nat", f":{svc} - [0:0]", f":{masq} - [0:0]"]
    for cip, port, eip, eport in services:
        lines.append(
            f"-A {svc} -d {cip}/32 -p tcp --dport {port} -j DNAT --to-destination {eip}:{eport}"
        )
    for port in host_ports:
        lines.append(
            f"-A {svc} -d {gateway}/32 -p tcp --dport {port}"
            f" -j DNAT --to-destination 127.0.0.1:{port}"
        )
    lines.append(f"-A {masq} -s {subnet} -d {subnet} -m conntrack --ctstate DNAT -j MASQUERADE")
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


Backends = dict[tuple[str, str], dict[str, tuple[str, int]]]


def _from_slices(discovery: Any) -> Backends:
    """(namespace, service) -> port name -> its first ready endpoint, from EndpointSlices."""
    ready: Backends = {}
    for sl in discovery.list_endpoint_slice_for_all_namespaces().items:
        owner = (sl.metadata.labels or {}).get("kubernetes.io/service-name")
        if not owner or sl.address_type != "IPv4":
            continue
        addrs = sorted(
            e.addresses[0]
            for e in sl.endpoints or []
            if e.addresses and (e.conditions is None or e.conditions.ready is not False)
        )
        for p in sl.ports or [] if addrs else []:
            ready.setdefault((sl.metadata.namespace, owner), {}).setdefault(
                p.name or "", (addrs[0], p.port)
            )
    return ready


def _from_endpoints(core: Any, ready: Backends) -> None:
    """The API server writes the `kubernetes` Service's Endpoints itself; its EndpointSlice
    comes from a controller the sandbox may not run: Endpoints fill what no slice has."""
    for ep in core.list_endpoints_for_all_namespaces().items:
        key = (ep.metadata.namespace, ep.metadata.name)
        if key in ready:
            continue
        for subset in ep.subsets or []:
            addrs = sorted(a.ip for a in subset.addresses or [])
            for p in subset.ports or [] if addrs else []:
                ready.setdefault(key, {}).setdefault(p.name or "", (addrs[0], p.port))


def desired(
    core: Any, discovery: Any, api_port: int
) -> tuple[list[tuple[str, int, str, int]], dict[str, str]]:
    """(the DNAT targets, DNS name -> ClusterIP) from the cluster's Services and endpoints."""
    ready = _from_slices(discovery)
    _from_endpoints(core, ready)
    # The sandbox's API server advertises 127.0.0.1, which no Endpoints may hold (loopback is
    # refused): it writes none for the `kubernetes` Service, so its backend is said here.
    ready.setdefault(("default", "kubernetes"), {"https": ("127.0.0.1", api_port)})
    targets: list[tuple[str, int, str, int]] = []
    names: dict[str, str] = {}
    for s in core.list_service_for_all_namespaces().items:
        cip = s.spec.cluster_ip
        if not cip or cip == "None":
            continue
        ns, name = s.metadata.namespace, s.metadata.name
        names[f"{name}.{ns}.svc.{CLUSTER_DOMAIN}"] = cip
        eps = ready.get((ns, name), {})
        for p in s.spec.ports or []:
            target = eps.get(p.name or "")
            if (p.protocol or "TCP") == "TCP" and target is not None:
                targets.append((cip, p.port, target[0], target[1]))
    return sorted(targets), names


# ---- DNS ----------------------------------------------------------------------------------
def _qname(packet: bytes) -> tuple[str, int]:
    """The first question's name and the offset just past it."""
    labels, i = [], 12
    while packet[i]:
        n = packet[i]
        labels.append(packet[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    return ".".join(labels).lower(), i + 1


def dns_answer(packet: bytes, names: Mapping[str, str]) -> bytes | None:
    """The reply to one query: an A record for a known Service name, NOERROR with no record
    for its other types (AAAA), NXDOMAIN for any other name."""
    if len(packet) < 17:
        return None
    (qid, _flags, qdcount) = struct.unpack("!HHH", packet[:6])
    if qdcount != 1:
        return None
    name, end = _qname(packet)
    qtype, _qclass = struct.unpack("!HH", packet[end : end + 4])
    question = packet[12 : end + 4]
    ip = names.get(name)
    rcode = 0 if ip is not None else 3
    answers = b""
    if ip is not None and qtype == 1:
        answers = struct.pack("!HHHIH", 0xC00C, 1, 1, _TTL, 4) + socket.inet_aton(ip)
    header = struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, 1 if answers else 0, 0, 0)
    return header + question + answers


def serve_dns(address: str, names: dict[str, str], stop: threading.Event) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 53))
    sock.settimeout(0.5)
    while not stop.is_set():
        try:
            packet, peer = sock.recvfrom(512)
        except TimeoutError:
            continue
        with contextlib.suppress(Exception):  # a malformed query is dropped, the server lives
            reply = dns_answer(packet, names)
            if reply is not None:
                sock.sendto(reply, peer)


# ---- main ---------------------------------------------------------------------------------
def read_ports(path: Path) -> list[int]:
    try:
        return sorted({int(line) for line in path.read_text().split()})
    except (FileNotFoundError, ValueError):
        return []


def run(args: argparse.Namespace) -> None:
    kubeconfig, key, bridge = args.kubeconfig, args.key, args.bridge
    subnet, gateway, host_ports_file = args.subnet, args.gateway, args.host_ports_file
    from kubernetes import client, config

    load: Any = config.new_client_from_config
    api = load(config_file=str(kubeconfig))
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    api_port = urlsplit(api.configuration.host).port or 443
    ipaddress.ip_network(subnet)  # a typo fails here, not in iptables-restore
    stop = threading.Event()
    names: dict[str, str] = {}

    def on_term(*_: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    setup(key, bridge)
    dns = threading.Thread(target=serve_dns, args=(gateway, names, stop), daemon=True)
    dns.start()
    applied = ""
    try:
        while not stop.is_set():
            try:
                targets, found = desired(core, discovery, api_port)
            except Exception as exc:  # the API server restarting: keep the last rules
                log.warning("podnet: listing Services failed: %s", exc)
                stop.wait(1.0)
                continue
            names.clear()
            names.update(found)
            rules = render_rules(key, subnet, gateway, targets, read_ports(host_ports_file))
            if rules != applied:
                subprocess.run(
                    ["iptables-restore", "-w", "5", "--noflush"],
                    input=rules,
                    text=True,
                    check=True,
                    timeout=30,
                )
                applied = rules
                log.info("podnet: %d Service ports routed", len(targets))
            stop.wait(1.0)
    finally:
        cleanup(key, bridge)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpuheal_dev.sandbox.podnet")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--bridge", required=True)
    parser.add_argument("--subnet", required=True)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--host-ports-file", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    run(args)


if __name__ == "__main__":
    main()
