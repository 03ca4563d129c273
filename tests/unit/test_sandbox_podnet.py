"""The sandbox's Services and DNS for real-node pods (gpuheal_dev.sandbox.podnet): the rules it
writes and the DNS answers it gives (pure parts; the e2e test runs it for real)."""

from __future__ import annotations

import socket
import struct
from types import SimpleNamespace as NS

from gpuheal_dev.sandbox import podnet


def query(name: str, qtype: int = 1, qid: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return (
        struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", qtype, 1)
    )


NAMES = {"gpuheal-slurm-bridge.gpuheal-system.svc.cluster.local": "10.96.0.42"}


def test_a_service_name_gets_its_cluster_ip() -> None:
    q = query("gpuheal-slurm-bridge.gpuheal-system.svc.cluster.local")
    reply = podnet.dns_answer(q, NAMES)
    assert reply is not None
    qid, flags, qd, an = struct.unpack("!HHHH", reply[:8])
    assert (qid, flags & 0xF, qd, an) == (0x1234, 0, 1, 1)
    assert reply[-4:] == socket.inet_aton("10.96.0.42")


def test_other_names_are_nxdomain_and_aaaa_of_a_service_is_empty() -> None:
    reply = podnet.dns_answer(query("example.com"), NAMES)
    assert reply is not None
    assert struct.unpack("!HHHH", reply[:8])[1] & 0xF == 3
    aaaa = podnet.dns_answer(
        query("gpuheal-slurm-bridge.gpuheal-system.svc.cluster.local", 28), NAMES
    )
    assert aaaa is not None
    assert struct.unpack("!HHHH", aaaa[:8])[1:4:2] == (0x8180, 0)


def test_rules_dnat_services_and_exposed_host_ports_and_masquerade_hairpins() -> None:
    rules = podnet.render_rules(
        "abcd1234",
        "10.210.3.0/24",
        "10.210.3.1",
        [("10.96.0.42", 8787, "10.210.3.5", 8787)],
        [6820],
    )
    svc, masq = podnet.chains("abcd1234")
    assert (
        f"-A {svc} -d 10.96.0.42/32 -p tcp --dport 8787 -j DNAT --to-destination 10.210.3.5:8787"
        in rules
    )
    assert (
        f"-A {svc} -d 10.210.3.1/32 -p tcp --dport 6820 -j DNAT --to-destination 127.0.0.1:6820"
        in rules
    )
    assert (
        f"-A {masq} -s 10.210.3.0/24 -d 10.210.3.0/24 -m conntrack --ctstate DNAT -j MASQUERADE"
        in rules
    )
    assert rules.startswith("*nat\n")
    assert rules.endswith("COMMIT\n")


def test_the_kubernetes_service_goes_to_the_api_server_on_loopback() -> None:
    svc = NS(
        metadata=NS(namespace="default", name="kubernetes"),
        spec=NS(cluster_ip="10.96.0.1", ports=[NS(name="https", port=443, protocol="TCP")]),
    )
    core = NS(
        list_service_for_all_namespaces=lambda: NS(items=[svc]),
        list_endpoints_for_all_namespaces=lambda: NS(items=[]),
    )
    discovery = NS(list_endpoint_slice_for_all_namespaces=lambda: NS(items=[]))
    targets, names = podnet.desired(core, discovery, 6443)
    assert targets == [("10.96.0.1", 443, "127.0.0.1", 6443)]
    assert names == {"kubernetes.default.svc.cluster.local": "10.96.0.1"}
