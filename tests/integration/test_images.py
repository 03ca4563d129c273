"""The images `make images` builds (hack/build-images.sh), each loaded from its tar into a podman
of the test's own and run as the chart runs it: its user (65532, non-root), a read-only root
filesystem, /tmp the only writable place (the chart's emptyDir), every capability dropped,
no privilege escalation, no network.

The session fixture runs the build script: seconds when `make images` (a prerequisite of
`make integration`) has built them, ~6 min cold.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# One worker runs them all (--dist loadgroup): the session's `images` fixture loads both tars
# (~460 MB) into a podman store of its own, once per worker that meets it; spread over four
# workers that was four loads beside the sandboxes.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("images")]

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "hack" / "build-images.sh"
OPERATOR = "gpuheal"
BRIDGE = "gpuheal-slurm-bridge"
# Sizes the images stay under (measured in the README, Images): a failure here means a new
# dependency or a base that grew; look at what it brought before raising the bound.
MAX_SIZE_MB = {OPERATOR: 225, BRIDGE: 250}

# Run inside the images (no shell in the operator's): what a read-only root needs.
IMAGE_CHECKS = r"""
import importlib, importlib.util, os, pkgutil, shutil, sys, sysconfig
out = {"uid": os.getuid(), "gid": os.getgid()}
out["compilers"] = [c for c in ("gcc", "cc", "c++", "g++", "clang", "tcc") if shutil.which(c)]
try:
    open(sys.prefix + "/written-by-test", "w")
    out["root_writable"] = True
except OSError:
    out["root_writable"] = False
with open("/tmp/written-by-test", "w") as f:
    f.write("ok")
# PYTHONDONTWRITEBYTECODE and a read-only root: a module without a .pyc built into the image
# is compiled again at every start.
tag = sys.implementation.cache_tag
missing = []
for top in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"]):
    for d, _, files in os.walk(top):
        for f in files:
            if f.endswith(".py") and "/test" not in d and "/idlelib" not in d:
                pyc = os.path.join(d, "__pycache__", f[:-3] + "." + tag + ".pyc")
                if not os.path.exists(pyc):
                    missing.append(os.path.join(d, f))
out["without_pyc"] = missing[:20]
out["without_pyc_count"] = len(missing)
imported = []
for pkg_name in sys.argv[1].split(","):
    pkg = importlib.import_module(pkg_name)
    for m in pkgutil.walk_packages(pkg.__path__, pkg_name + "."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
            imported.append(m.name)
out["imported"] = len(imported)
out["absent"] = [n for n in sys.argv[2].split(",") if n and importlib.util.find_spec(n) is None]
import json; print(json.dumps(out))
"""


@dataclass(frozen=True)
class Images:
    folder: Path
    podman: list[str]

    def tag(self, name: str) -> str:
        return f"docker.io/library/{name}:{_chart_app_version()}"

    def run(
        self, name: str, *args: str, entrypoint: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`podman run` with the chart's container securityContext and its one /tmp emptyDir."""
        cmd = [
            *self.podman, "run", "--rm", "--runtime", "runc", "--network", "none",
            "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,size=64m",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            # podman raises these limits by default; without CAP_SYS_RESOURCE here it cannot.
            "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
        ]  # fmt: skip
        if entrypoint is not None:
            cmd += ["--entrypoint", entrypoint]
        return subprocess.run(
            [*cmd, self.tag(name), *args], capture_output=True, text=True, timeout=120, check=False
        )


def _chart_app_version() -> str:
    for line in (ROOT / "deploy/helm/gpuheal/Chart.yaml").read_text().splitlines():
        if line.startswith("appVersion:"):
            return line.split(":", 1)[1].strip().strip('"')
    raise AssertionError("Chart.yaml has no appVersion")


@pytest.fixture(scope="session")
def images() -> Iterator[Images]:
    missing = [t for t in ("buildah", "mmdebstrap", "podman", "runc") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"`make images` installs what these tests need; missing: {', '.join(missing)}")
    built = subprocess.run(
        [str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1500, check=False
    )
    assert built.returncode == 0, f"{BUILD_SCRIPT} failed:\n{built.stderr[-4000:]}"
    folder = Path(built.stdout.strip().splitlines()[-1])
    # podman refuses a runroot over 50 characters: an xdist worker's tmp_path is longer
    store = Path(tempfile.mkdtemp(prefix="gh-podman-", dir="/tmp"))
    podman = ["podman", "--root", str(store / "root"), "--runroot", str(store / "run"),
              "--storage-driver", "overlay"]  # fmt: skip
    for name in (OPERATOR, BRIDGE):
        loaded = subprocess.run(
            [*podman, "load", "-q", "-i", str(folder / f"{name}.tar")],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert loaded.returncode == 0, loaded.stderr
    yield Images(folder, podman)
    subprocess.run([*podman, "rmi", "-a", "-f"], capture_output=True, timeout=120, check=False)
    shutil.rmtree(store, ignore_errors=True)


def _inspect(images: Images, name: str) -> dict[str, object]:
    out = subprocess.run(
        [*images.podman, "image", "inspect", images.tag(name)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    info: dict[str, object] = json.loads(out.stdout)[0]
    return info


@pytest.mark.parametrize("name", [OPERATOR, BRIDGE])
def test_image_tar_is_tagged_as_the_chart_names_it_non_root_and_small(
    images: Images, name: str
) -> None:
    # `ctr -n k8s.io images import` and `podman load` name the image from the tar: it must be
    # what the chart's default `image.repository` and appVersion tag resolve to.
    info = _inspect(images, name)
    assert images.tag(name) in info["RepoTags"]  # type: ignore[operator]
    config = info["Config"]
    assert isinstance(config, dict)
    assert config["User"] == "65532:65532"
    size_mb = int(info["Size"]) / 1e6  # type: ignore[call-overload]
    assert size_mb <= MAX_SIZE_MB[name], f"{name} is {size_mb:.0f} MB"


@pytest.mark.parametrize(
    ("entrypoint", "args", "usage"),
    [
        (None, ["--help"], "usage: gpuheal "),
        (None, ["agent", "--help"], "usage: gpuheal agent"),
        # How the chart's DaemonSet starts the agent.
        ("python", ["-m", "gpuheal.agent", "--help"], "usage: gpuheal agent"),
    ],
)
def test_operator_image_runs_its_commands_read_only(
    images: Images, entrypoint: str | None, args: list[str], usage: str
) -> None:
    done = images.run(OPERATOR, *args, entrypoint=entrypoint)
    assert done.returncode == 0, done.stderr
    assert usage in done.stdout


def test_operator_image_imports_every_module_with_bytecode_and_no_compiler(images: Images) -> None:
    done = images.run(OPERATOR, "-c", IMAGE_CHECKS, "gpuheal", "", entrypoint="python")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["uid"], out["gid"]) == (65532, 65532)
    assert out["root_writable"] is False
    assert out["compilers"] == []
    assert out["without_pyc_count"] == 0, out["without_pyc"]
    assert out["imported"] > 50
    # The operator image has no shell and no package manager (the chart runs only python).
    absent = images.run(OPERATOR, "-c", "import shutil; print([shutil.which(c) for c in "
                        "('sh', 'bash', 'apt-get', 'dpkg')])", entrypoint="python")  # fmt: skip
    assert absent.stdout.strip() == "[None, None, None, None]", absent.stdout + absent.stderr


def test_bridge_image_runs_read_only_with_its_slurm_client(images: Images) -> None:
    done = images.run(BRIDGE, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: gpuheal-slurm-bridge" in done.stdout

    checks = images.run(
        BRIDGE, "-c", IMAGE_CHECKS, "gpuheal_bridge", "kopf,kubernetes,kubernetes_asyncio,gpuheal",
        entrypoint="python",
    )  # fmt: skip
    assert checks.returncode == 0, checks.stderr
    out = json.loads(checks.stdout)
    assert (out["uid"], out["gid"]) == (65532, 65532)
    assert out["root_writable"] is False
    assert out["compilers"] == []
    assert out["without_pyc_count"] == 0, out["without_pyc"]
    # The bridge never brings the operator or a Kubernetes client onto a Slurm host.
    assert out["absent"] == ["kopf", "kubernetes", "kubernetes_asyncio", "gpuheal"]

    # The `cli` backend's commands, with every library they load (they need slurm.conf and
    # munge to do more, which the chart mounts).
    slurm = images.run(
        BRIDGE, "-c",
        "for c in scontrol sinfo squeue scancel; do command -v $c || exit 1; ldd /usr/bin/$c; done",
        entrypoint="sh",
    )  # fmt: skip
    assert slurm.returncode == 0, slurm.stdout + slurm.stderr
    for cmd in ("scontrol", "sinfo", "squeue", "scancel"):
        assert f"/usr/bin/{cmd}" in slurm.stdout
    assert "not found" not in slurm.stdout
