"""Pure pieces of the Slurm sandbox (config rendering, validation) and the process helpers."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpuheal_dev.sandbox import _proc, cgroup, slurmroot
from gpuheal_dev.sandbox.faults import FakeGpus, GpuState, read_gpu_state
from gpuheal_dev.sandbox.slurm import (
    SlurmCluster,
    SlurmCommandError,
    SlurmConfig,
    SlurmLayout,
    client_env,
    parse_node_states,
    render_gres_conf,
    render_slurm_conf,
    validate_node_names,
)


def make_config(gpus: int = 8, **kwargs: object) -> SlurmConfig:
    return SlurmConfig(
        layout=SlurmLayout(Path("/sb/slurm")),
        host="vm",
        ctld_port=21000,
        node_ports={"gpu-node-0": 21001, "gpu-spare-0": 21007},
        gpus_per_node=gpus,
        **kwargs,  # type: ignore[arg-type]
    )


def conf_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_slurm_conf_has_what_the_sandbox_relies_on() -> None:
    lines = conf_lines(render_slurm_conf(make_config(cred_expire=7)))
    for expected in (
        "SlurmctldHost=vm(127.0.0.1)",
        "SlurmctldPort=21000",
        "AuthInfo=socket=/sb/slurm/munge/munge.sock,cred_expire=7",
        "JobRequeue=1",
        "ReturnToService=2",
        "SchedulerParameters=sched_interval=2,bf_interval=1",
        "GresTypes=gpu",
        "StateSaveLocation=/sb/slurm/state",
        "SlurmdSpoolDir=/sb/slurm/spool/%n",
        "SlurmdLogFile=/sb/slurm/log/slurmd@%n.log",
        "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ):
        assert expected in lines
    nodes = [line for line in lines if line.startswith("NodeName=")]
    assert nodes == [
        "NodeName=gpu-node-0 NodeHostname=vm NodeAddr=127.0.0.1 Port=21001"
        " CPUs=8 RealMemory=64000 Gres=gpu:8 State=UNKNOWN",
        "NodeName=gpu-spare-0 NodeHostname=vm NodeAddr=127.0.0.1 Port=21007"
        " CPUs=8 RealMemory=64000 Gres=gpu:8 State=UNKNOWN",
    ]
    # Every path the daemons write to is under the root.
    paths = [v for line in lines for v in line.split("=", 1)[1:] if v.startswith("/")]
    assert all(p.startswith("/sb/slurm/") or p == "/bin/true" for p in paths)


@pytest.mark.parametrize(
    ("gpus", "file_spec", "gres"),
    [
        (8, "File=/sb/slurm/dev/gpu[0-7]", " Gres=gpu:8 "),
        (1, "File=/sb/slurm/dev/gpu0", " Gres=gpu:1 "),
        (0, None, None),
    ],
)
def test_gres_conf_one_file_per_gpu(gpus: int, file_spec: str | None, gres: str | None) -> None:
    cfg = make_config(gpus=gpus)
    gres_lines = conf_lines(render_gres_conf(cfg))
    assert gres_lines[0] == "AutoDetect=off"
    node_lines = [line for line in conf_lines(render_slurm_conf(cfg)) if "NodeName=" in line]
    if file_spec is None or gres is None:
        assert gres_lines == ["AutoDetect=off"]
        assert all("Gres=" not in line for line in node_lines)
    else:
        assert gres_lines[1:] == [
            f"NodeName=gpu-node-0 Name=gpu {file_spec}",
            f"NodeName=gpu-spare-0 Name=gpu {file_spec}",
        ]
        assert all(gres in line for line in node_lines)
    assert cfg.layout.gpu_files(gpus) == [Path(f"/sb/slurm/dev/gpu{i}") for i in range(gpus)]


@pytest.mark.parametrize(
    "names", [["gpu-node-0"], ["a", "b.c", "d_e", "node7", "ip-10-0-0-1.ec2.internal"]]
)
def test_valid_node_names(names: list[str]) -> None:
    assert validate_node_names(names) == names


@pytest.mark.parametrize(
    ("names", "error"),
    [
        ([], "at least one"),
        (["gpu node"], "invalid"),
        (["node[1-3]"], "invalid"),
        (["a,b"], "invalid"),
        (["-lead"], "invalid"),
        (["trail-"], "invalid"),
        (["n1", "n2", "n1"], "duplicate"),
    ],
)
def test_invalid_node_names(names: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        validate_node_names(names)


def test_cluster_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cred_expire"):
        SlurmCluster(tmp_path, ["n1"], cred_expire=4)
    with pytest.raises(ValueError, match="too deep"):
        SlurmCluster(tmp_path / ("x" * 100), ["n1"])
    # slurmstepd's socket <root>/spool/<node>/<node>_<job>.<step> is the longest path
    SlurmCluster(Path("/tmp/s"), ["n" * 35])
    with pytest.raises(ValueError, match=r"too deep.*_4294967295\.4294967295 has 108"):
        SlurmCluster(Path("/tmp/s"), ["n" * 36])
    # a short root: an xdist worker's tmp_path leaves the socket path a byte too long
    short = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    cluster = SlurmCluster(short, ["n1"])
    assert cluster.env == {"SLURM_CONF": str(short / "etc" / "slurm.conf")}
    assert cluster.restd_socket is None
    assert cluster.restd_url is None
    assert not cluster.status().running
    cluster.stop()  # never started: a no-op
    shutil.rmtree(short)


def test_client_env_drops_inherited_slurm_variables() -> None:
    env = client_env(
        Path("/x/slurm.conf"), {"PATH": "/bin", "SLURM_JOB_ID": "3", "SLURM_CONF": "/other"}
    )
    assert env == {"PATH": "/bin", "SLURM_CONF": "/x/slurm.conf"}


def test_parse_node_states() -> None:
    out = "gpu-node-0 idle\ngpu-node-1 drained\n\ngpu-node-1 drained\ngpu-node-2 idle*\n"
    assert parse_node_states(out) == {
        "gpu-node-0": "idle",
        "gpu-node-1": "drained",
        "gpu-node-2": "idle*",
    }


def test_command_error_shows_stderr() -> None:
    err = SlurmCommandError(1, ["scontrol", "requeue", "9"], "", "Invalid job id specified\n")
    assert str(err) == "scontrol requeue 9 exited 1: Invalid job id specified"


# ---- _proc


def test_free_tcp_ports_are_distinct_bindable_and_not_repeated() -> None:
    first = _proc.free_tcp_ports(5)
    second = _proc.free_tcp_ports(5)
    assert len(set(first) | set(second)) == 10
    for port in first:
        assert _proc.port_free(port)
        assert port < _proc._ephemeral_low()


def test_port_free_sees_a_listener() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not _proc.port_free(s.getsockname()[1])


def test_pid_alive_treats_a_zombie_as_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    _proc.wait_for(lambda: _proc.proc_state(child.pid) == "Z", what="zombie", timeout=10)
    assert not _proc.pid_alive(child.pid)  # still in /proc, kill -0 would succeed
    os.kill(child.pid, 0)
    child.wait()
    assert _proc.proc_state(child.pid) is None
    assert _proc.pid_alive(os.getpid())


def test_stop_pid_checks_the_executable() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert not _proc.stop_pid(child.pid, {"slurmd", "slurmd-wlm"})
        assert _proc.pid_alive(child.pid)
        assert _proc.exe_name(child.pid) == "sleep"
        assert _proc.stop_pid(child.pid, {"sleep"}, timeout=5)
        assert not _proc.pid_alive(child.pid)
        assert not _proc.stop_pid(child.pid, {"sleep"})  # already gone: idempotent
    finally:
        child.kill()
        child.wait()


def test_descendants_and_find_pids_by_environment() -> None:
    marker = f"test-{os.getpid()}-{time.monotonic_ns()}"
    parent = subprocess.Popen(
        ["bash", "-c", "sleep 30 & sleep 30 & wait"], env={**os.environ, "TEST_MARK": marker}
    )
    try:

        def two_children() -> list[int] | None:
            kids = _proc.descendants(parent.pid)
            return kids if len(kids) == 2 else None

        kids = _proc.wait_for(two_children, what="two children", timeout=10)
        found = _proc.find_pids(env_match={"TEST_MARK": marker})
        assert sorted(found) == sorted([parent.pid, *kids])
        assert _proc.find_pids(env_match={"TEST_MARK": marker}, exe_names={"sleep"}) == sorted(kids)
        assert (_proc.proc_environ(parent.pid) or {}).get("TEST_MARK") == marker
        assert _proc.kill_pids([parent.pid, *kids]) == []
    finally:
        parent.kill()
        parent.wait()


def test_wait_for_returns_the_value_or_says_what_it_waited_for() -> None:
    values = iter([None, 0, "ready"])
    assert _proc.wait_for(lambda: next(values), what="x", timeout=5, interval=0) == "ready"
    with pytest.raises(_proc.WaitTimeout, match=r"waiting for the moon \(last: False\)"):
        _proc.wait_for(lambda: False, what="the moon", timeout=0.05, interval=0.01)


def test_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "d.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    tail = _proc.log_tail(log, 3)
    assert tail.endswith("line 97\nline 98\nline 99")
    assert "no log" in _proc.log_tail(tmp_path / "missing.log")


@pytest.mark.parametrize("proctrack", ["linuxproc", "cgroup"])
def test_process_tracking_and_unkillable_timeout_are_rendered(proctrack: str) -> None:
    cfg = make_config(proctrack=proctrack, unkillable_step_timeout=9)
    lines = conf_lines(render_slurm_conf(cfg))
    assert f"ProctrackType=proctrack/{proctrack}" in lines
    assert "UnkillableStepTimeout=9" in lines
    assert "KillWait=2" in lines


def test_each_cluster_has_its_own_freezer_cgroup() -> None:
    a, b = Path("/tmp/gpuheal-slurm-a"), Path("/tmp/gpuheal-slurm-b")
    assert cgroup.host_cgroup(a) != cgroup.host_cgroup(b)
    assert cgroup.host_cgroup(a) == cgroup.host_cgroup(a)
    assert cgroup.host_cgroup(a).parent == cgroup.HOST_FREEZER
    text = cgroup.render_cgroup_conf(a)
    assert "CgroupPlugin=cgroup/v1" in text
    assert f"CgroupMountpoint={a}/cgroup" in text
    assert "CgroupAutomount=no" in text


def test_the_jobs_view_of_its_fake_gpu(tmp_path: Path) -> None:
    gpus = FakeGpus(tmp_path / "gpus")
    env = {**gpus.env(), "SLURMD_NODENAME": "gpu-node-0"}
    assert read_gpu_state(env) == (GpuState.OK, None)
    gpus.set("gpu-node-0", GpuState.LOST)
    assert read_gpu_state(env) == (GpuState.LOST, None)
    assert read_gpu_state({**env, "SLURMD_NODENAME": "gpu-node-1"}) == (GpuState.OK, None)
    gpus.set("gpu-node-0", GpuState.WEDGED, tmp_path / "wedge" / "gpu0")
    assert read_gpu_state(env) == (GpuState.WEDGED, str(tmp_path / "wedge" / "gpu0"))
    with pytest.raises(ValueError, match="Wedge"):
        gpus.set("gpu-node-0", GpuState.WEDGED)
    gpus.heal("gpu-node-0")
    assert read_gpu_state(env) == (GpuState.OK, None)
    assert read_gpu_state({}) == (GpuState.OK, None)  # outside the sandbox: nothing


def test_cluster_refuses_an_unknown_process_tracking(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="proctrack"):
        SlurmCluster(tmp_path / "s", ["n0"], proctrack="pgid")


def test_slurm_26_conf_adds_jwt_and_expedited_requeue_and_22_has_neither() -> None:
    new = conf_lines(render_slurm_conf(make_config(release="26.05")))
    assert "AuthAltTypes=auth/jwt" in new
    assert "AuthAltParameters=jwt_key=/sb/slurm/etc/jwt_hs256.key" in new
    assert "SlurmctldParameters=enable_expedited_requeue" in new
    old = conf_lines(render_slurm_conf(make_config()))
    assert not [line for line in old if line.startswith(("AuthAlt", "SlurmctldParameters"))]


def test_cluster_refuses_an_unknown_slurm_release_and_cgroup_in_a_root(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"slurm must be one of 22\.05, 26\.05"):
        SlurmCluster(tmp_path, ["n0"], slurm="25.11")
    # 26.05 tracks with cgroup too where the machine allows it (checked at start)
    assert SlurmCluster(tmp_path, ["n0"], slurm="26.05", proctrack="cgroup").release == "26.05"


def test_slurm_root_names_and_releases(tmp_path: Path) -> None:
    versions = {"slurmctld": "26.05.5-1", "munge": "0.5.18-1"}
    name = slurmroot.root_name(versions)
    assert re.fullmatch(r"slurm-26\.05\.5-1_munge-0\.5\.18-1_[0-9a-f]{8}", name), name
    # another package set is another root, built beside the old one
    assert slurmroot.root_name(versions, ("munge", "slurmctld")) != name
    assert slurmroot.release_of("26.05.5-1") == "26.05"
    with pytest.raises(slurmroot.SlurmRootError):
        slurmroot.release_of("sid")
    with pytest.raises(slurmroot.SlurmRootError, match=r"the host's is 22\.05"):
        slurmroot.ensure_root("22.05", cache=tmp_path)
    # only a complete root is reused: manifest, the way in and the marker in its tree
    half = tmp_path / name
    (half / "bin").mkdir(parents=True)
    (half / "bin" / slurmroot.ENTER).write_text("")
    manifest = {"versions": {**dict.fromkeys(slurmroot.PACKAGES, "26.05.5-1"), **versions}}
    (half / "manifest.json").write_text(json.dumps(manifest))
    assert slurmroot.cached("26.05", tmp_path) is None
    marker = half / "root" / slurmroot.MARKER.lstrip("/")
    marker.parent.mkdir(parents=True)
    marker.write_text(str(half / "root"))
    assert slurmroot.cached("26.05", tmp_path) == slurmroot.SlurmRoot(half)
    assert slurmroot.cached("26.11", tmp_path) is None
    # a root of the same versions built by older code (no digest, fewer packages) is not used
    older = tmp_path / "slurm-26.05.5-1_munge-0.5.18-1"
    shutil.copytree(half, older)
    assert slurmroot.cached("26.05", tmp_path) == slurmroot.SlurmRoot(half)
