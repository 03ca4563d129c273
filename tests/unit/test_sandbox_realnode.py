"""The real node's configuration (pure: what it writes, nothing started) and the image tars
``localimage`` writes. Running it: tests/integration/test_realnode.py."""

from __future__ import annotations

import json
import os
import tarfile
import tomllib
from pathlib import Path

from gpuheal_dev.sandbox.localimage import PAUSE_IMAGE, write_image_tar
from gpuheal_dev.sandbox.realnode import (
    RealNodeLayout,
    cni_config,
    containerd_config,
    kubelet_config,
)


def test_two_sandboxes_share_no_socket_cgroup_network_or_subnet(tmp_path: Path) -> None:
    a, b = RealNodeLayout(tmp_path / "a" / "realnode"), RealNodeLayout(tmp_path / "b" / "realnode")
    for attr in ("socket", "cgroup_parent", "network", "bridge", "subnet", "node_ip", "run_dir"):
        assert getattr(a, attr) != getattr(b, attr), attr
    for lay in (a, b):
        assert len(lay.bridge) <= 15  # IFNAMSIZ - 1
        assert len(os.fsencode(lay.socket)) < 108  # sun_path
        assert lay.node_ip.startswith(lay.subnet.removesuffix("0/24"))
        assert not lay.node_ip.startswith("127.")


def test_containerd_settings_this_machine_needs(tmp_path: Path) -> None:
    lay = RealNodeLayout(tmp_path)
    conf = tomllib.loads(containerd_config(lay))
    cri = conf["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == PAUSE_IMAGE
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["cni"]["conf_dir"] == str(lay.cni_conf_dir)
    assert conf["grpc"]["address"] == str(lay.socket)
    for key in ("root", "state"):
        assert Path(conf[key]).is_relative_to(tmp_path)
    (bridge,) = cni_config(lay)["plugins"]
    assert bridge["bridge"] == lay.bridge
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": lay.subnet}]]


def test_kubelet_settings_this_machine_needs(tmp_path: Path) -> None:
    lay = RealNodeLayout(tmp_path)
    conf = kubelet_config(lay, tmp_path / "ca.crt", {"kubelet": 1, "kubelet-healthz": 2})
    assert conf["failCgroupV1"] is False
    assert conf["cgroupDriver"] == "cgroupfs"
    assert conf["makeIPTablesUtilChains"] is False  # host-wide rules would outlive the sandbox
    assert conf["cgroupRoot"] == lay.cgroup_parent
    assert conf["containerRuntimeEndpoint"] == f"unix://{lay.socket}"
    assert conf["address"] == lay.node_ip
    assert conf["authentication"]["anonymous"] == {"enabled": False}
    assert conf["authorization"]["mode"] == "Webhook"
    assert Path(conf["podLogsDir"]).is_relative_to(tmp_path)


def test_image_tar_is_a_docker_archive_and_reproducible(tmp_path: Path) -> None:
    src = tmp_path / "tool"
    src.write_bytes(b"#!/bin/sh\necho hi\n")
    src.chmod(0o755)
    ref = "gpuheal.local/t:1"
    first = write_image_tar(tmp_path / "1.tar", ref, {"/bin/tool": src}, entrypoint=["/bin/tool"])
    second = write_image_tar(tmp_path / "2.tar", ref, {"/bin/tool": src}, entrypoint=["/bin/tool"])
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as tar:
        (manifest,) = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert manifest["RepoTags"] == [ref]
        config = json.load(tar.extractfile(manifest["Config"]))  # type: ignore[arg-type]
        assert config["config"]["Entrypoint"] == ["/bin/tool"]
        (layer_name,) = manifest["Layers"]
        layer = tar.extractfile(layer_name)
        assert layer is not None
        with tarfile.open(fileobj=layer) as inner:
            tool = inner.getmember("bin/tool")
            assert tool.mode == 0o755
            assert {"bin", "tmp"} <= set(inner.getnames())
