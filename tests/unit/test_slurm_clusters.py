"""Several Slurm clusters: which cluster (so which bridge) a node belongs to, the operator's
bridges from its flags and --bridges-file, and the Runtime's lookup that steps go through."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuheal.adapters.slurm import BridgeSlurm, TokenFile, UnknownCluster
from gpuheal.cli import build_parser
from gpuheal.config import OperatorConfig, bridge_targets, config_from_args
from gpuheal.metrics import Metrics
from gpuheal.policy.inputs import node_view
from gpuheal.policy.select import slurm_cluster
from gpuheal.remediation.state import Runtime
from gpuheal_bridge.client import BridgeClient
from tests.unit.test_policy_select import make_policy

LABEL = "gpuheal.io/slurm-cluster"


@pytest.mark.parametrize(
    ("labels", "policy", "cluster"),
    [
        ({}, None, None),  # neither: the default bridge
        ({LABEL: "b"}, None, "b"),
        ({}, "b", "b"),
        ({LABEL: "a"}, "b", "a"),  # the node's own label wins over its policy
        ({LABEL: ""}, "b", "b"),  # an empty label says nothing
        ({"other": "a"}, None, None),
    ],
)
def test_slurm_cluster_of_a_node(
    labels: dict[str, str], policy: str | None, cluster: str | None
) -> None:
    assert slurm_cluster(labels, LABEL, policy) == cluster


def _run_config(*argv: str) -> OperatorConfig:
    return config_from_args(build_parser(["run"]).parse_args(["run", *argv]))


def test_bridges_from_the_flags_and_the_file(tmp_path: Path) -> None:
    file = tmp_path / "bridges.yaml"
    file.write_text(
        "clusters:\n"
        "  hpc-b:\n"
        "    url: https://bridge-b.example:8787\n"
        "    tokenFile: /tokens/b\n"
        "    caFile: /ca/b.pem\n"
        "  hpc-c: {url: 'http://127.0.0.1:9000'}\n"
    )
    cfg = _run_config(
        "--bridge-url", "https://bridge-a:8787", "--bridge-cluster", "hpc-a",
        "--bridge-token-file", "/tokens/a", "--bridges-file", str(file),
    )  # fmt: skip
    targets = bridge_targets(cfg)
    assert sorted(targets) == ["hpc-a", "hpc-b", "hpc-c"]
    assert (targets["hpc-a"].url, targets["hpc-a"].token_file) == (
        "https://bridge-a:8787",
        "/tokens/a",
    )
    assert (targets["hpc-b"].token_file, targets["hpc-b"].ca_file) == ("/tokens/b", "/ca/b.pem")
    assert targets["hpc-c"].token_file is None
    assert bridge_targets(_run_config()) == {}  # no Slurm at all


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("clusters:\n  hpc-b: {url: 'ftp://x'}\n", "String should match pattern"),
        ("clusters:\n  hpc-b: {url: 'http://x', token: abc}\n", "Extra inputs are not permitted"),
        ("clusters:\n  HPC_B: {url: 'http://x'}\n", "cluster names must be DNS labels"),
        ("clusters:\n  default: {url: 'http://x'}\n", "'default' is --bridge-cluster and in"),
        ("clusters: [\n", "while parsing a flow node"),
    ],
)
def test_a_bad_bridges_file_stops_the_start_with_the_reason(
    tmp_path: Path, text: str, why: str
) -> None:
    file = tmp_path / "bridges.yaml"
    file.write_text(text)
    with pytest.raises(SystemExit, match="--bridges-file") as info:
        _run_config("--bridge-url", "http://a:1", "--bridges-file", str(file))
    assert why in str(info.value)
    with pytest.raises(SystemExit, match="No such file"):
        _run_config("--bridges-file", str(tmp_path / "missing.yaml"))


def _bridge(url: str) -> BridgeSlurm:
    return BridgeSlurm(BridgeClient(url, "t" * 20))


def test_runtime_routes_each_node_to_its_clusters_bridge() -> None:
    rt = Runtime(OperatorConfig(), Metrics(CollectorRegistry()))
    a, b = _bridge("http://a:1"), _bridge("http://b:1")
    rt.ports.bridges = {"default": a, "hpc-b": b}
    rt.ports.slurm = a
    rt.view.set_policy(make_policy("p", labels={"pool": "train"}))
    rt.view.set_policy(make_policy("q", labels={"pool": "b-side"}).model_copy(deep=True))
    q = rt.view.policies["q"]
    rt.view.set_policy(
        q.model_copy(update={"spec": q.spec.model_copy(update={"slurm_cluster": "hpc-b"})})
    )
    for name, labels in {
        "n-plain": {"pool": "train"},
        "n-labelled": {"pool": "train", LABEL: "hpc-b"},
        "n-by-policy": {"pool": "b-side"},
        "n-elsewhere": {"pool": "train", LABEL: "hpc-z"},
    }.items():
        rt.view.set_node(node_view({"metadata": {"name": name, "labels": labels}}))
    assert rt.ports.slurm_for(rt.view, "n-plain") is a
    assert rt.ports.slurm_for(rt.view, "n-labelled") is b
    assert rt.ports.slurm_for(rt.view, "n-by-policy") is b
    assert rt.ports.slurm_for(rt.view, "gone") is a  # a node not seen: the default
    with pytest.raises(UnknownCluster, match="'hpc-z', which has no bridge"):
        rt.ports.slurm_for(rt.view, "n-elsewhere")
    rt.ports.slurm, rt.ports.bridges = None, {}
    assert rt.ports.slurm_for(rt.view, "n-plain") is None  # no Slurm configured: nothing to drain
    asyncio.run(a.close())
    asyncio.run(b.close())


def test_messages_name_the_bridge_by_scheme_and_host() -> None:
    """A bridge URL with credentials or a path is not written whole into a status."""
    bridge = _bridge("https://user:pw@bridge.example:8787/prefix")
    assert bridge.where == "Slurm bridge https://bridge.example:8787/..."
    asyncio.run(bridge.close())


def test_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("old-token-0123456789\n")
    token = TokenFile(path)
    assert token() == "old-token-0123456789"
    rotated = tmp_path / "token.new"
    rotated.write_text("new-token-0123456789-longer\n")
    rotated.replace(path)  # an atomic swap, as a Secret volume does it
    assert token() == "new-token-0123456789-longer"
    path.unlink()
    assert token() == "new-token-0123456789-longer"  # unreadable for a moment: the last stays
    with pytest.raises(FileNotFoundError):
        TokenFile(tmp_path / "never")


def test_the_run_flags_copies_of_api_names_agree() -> None:
    """config.py keeps a few API names literal (so `gpuheal run --help` loads no CRD model)."""
    from gpuheal import config
    from gpuheal.api.meta import DNS_LABEL_PATTERN
    from gpuheal.api.names import SLURM_CLUSTER_LABEL
    from gpuheal.api.remediationpolicy import NotifyEvent

    assert config.DNS_LABEL_PATTERN == DNS_LABEL_PATTERN
    assert config.SLURM_CLUSTER_LABEL == SLURM_CLUSTER_LABEL
    assert ",".join(e.value for e in NotifyEvent) == config.NOTIFY_EVENTS
